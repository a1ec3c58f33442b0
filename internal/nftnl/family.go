package nftnl

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// Family holds what differs between an ip and an ip6 table.
type Family struct {
	// IP is the IP family.
	IP model.IPFamily
	// Proto is the table family, NFPROTO_IPV4 or NFPROTO_IPV6 (the
	// nfgenmsg family of every message).
	Proto byte
	// AddrLen is the length of an address in bytes: 4 or 16.
	AddrLen uint32
	// SaddrOff and DaddrOff are the offsets of the source and destination
	// addresses in the network header.
	SaddrOff, DaddrOff uint32
	// AddrType is nft's datatype of an address of the family.
	AddrType Datatype
	// PortUnreach is the ICMP (ICMPv6) code of "port unreachable".
	PortUnreach uint8
}

// FamilyOf returns the facts of the IPv4 or IPv6 family; any other value
// gives IPv4's.
func FamilyOf(f model.IPFamily) Family {
	if f == model.IPv6 {
		return Family{IP: f, Proto: unix.NFPROTO_IPV6, AddrLen: 16, SaddrOff: 8, DaddrOff: 24,
			AddrType: TypeIP6Addr, PortUnreach: 4 /* ICMPV6_PORT_UNREACH */}
	}
	return Family{IP: model.IPv4, Proto: unix.NFPROTO_IPV4, AddrLen: 4, SaddrOff: 12, DaddrOff: 16,
		AddrType: TypeIPAddr, PortUnreach: 3 /* ICMP_PORT_UNREACH */}
}

// Name returns the family as nft names tables: "ip" or "ip6".
func (f *Family) Name() string { return protoName(f.Proto) }

// protoName names a table family as nft does.
func protoName(proto byte) string {
	switch proto {
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_IPV6:
		return "ip6"
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return "family" + itoa(uint64(proto))
}

// AddrRegs returns the number of 32-bit registers an address takes.
func (f *Family) AddrRegs() uint32 { return f.AddrLen / 4 }

// Addr returns a as the family's packets carry it: 4 bytes (an
// IPv4-mapped address is unmapped) or 16.
func (f *Family) Addr(a netip.Addr) []byte {
	if f.AddrLen == 4 {
		b := a.Unmap().As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

// Key returns the concatenation address . protocol . port, as a set
// whose key type is Concat(AddrType, TypeInetProto, TypeInetService)
// holds it: every field padded to 4 bytes.
func (f *Family) Key(a netip.Addr, p model.Protocol, port uint16) []byte {
	k := append(f.Addr(a), p.Number(), 0, 0, 0)
	return append(k, byte(port>>8), byte(port), 0, 0)
}

// PortKey returns the concatenation protocol . port.
func PortKey(p model.Protocol, port uint16) []byte {
	return []byte{p.Number(), 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
}

// Port returns a port as a concatenation field: network byte order,
// padded to 4 bytes.
func Port(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

// U32 encodes v in host byte order, as registers hold numbers (marks,
// conntrack state, numgen results).
func U32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// BE32 encodes v in network byte order.
func BE32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// LastAddr returns the last address of p.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Datatype is an nft datatype as set definitions carry it
// (NFTA_SET_KEY_TYPE, NFTA_SET_DATA_TYPE): a basic type's number, or a
// concatenation of up to five ([Concat]).
type Datatype uint32

// Basic datatypes (nft's datatypes.h).
const (
	TypeVerdict     Datatype = 1
	TypeIPAddr      Datatype = 7
	TypeIP6Addr     Datatype = 8
	TypeInetProto   Datatype = 12
	TypeInetService Datatype = 13
	TypeMark        Datatype = 19
)

// typeBits is the width of one field of a concatenated type.
const typeBits = 6

// Concat returns the concatenation of ts, as nft encodes it.
func Concat(ts ...Datatype) Datatype {
	var d Datatype
	for _, t := range ts {
		d = d<<typeBits | t
	}
	return d
}

// Fields returns the basic types of a concatenation, in order; a basic
// type is its own single field.
func (d Datatype) Fields() []Datatype {
	var out []Datatype
	for ; d != 0; d >>= typeBits {
		out = append(out, d&(1<<typeBits-1))
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// size returns the length of a basic type's value, 0 when unknown.
func (d Datatype) size() uint32 {
	switch d {
	case TypeIPAddr, TypeMark:
		return 4
	case TypeIP6Addr:
		return 16
	case TypeInetProto:
		return 1
	case TypeInetService:
		return 2
	}
	return 0
}

// Len returns the length of a value of the type: a concatenation pads
// each field to 4 bytes.
func (d Datatype) Len() uint32 {
	fs := d.Fields()
	if len(fs) == 1 {
		return fs[0].size()
	}
	var n uint32
	for _, f := range fs {
		n += align4u(f.size())
	}
	return n
}

// FieldLens returns the lengths of the fields (unpadded), as
// NFTA_SET_DESC_CONCAT describes a concatenated interval set's key.
func (d Datatype) FieldLens() []uint32 {
	var out []uint32
	for _, f := range d.Fields() {
		out = append(out, f.size())
	}
	return out
}

// String names the type as nft prints it, e.g. "ipv4_addr . inet_proto".
func (d Datatype) String() string {
	var parts []string
	for _, f := range d.Fields() {
		switch f {
		case TypeVerdict:
			parts = append(parts, "verdict")
		case TypeIPAddr:
			parts = append(parts, "ipv4_addr")
		case TypeIP6Addr:
			parts = append(parts, "ipv6_addr")
		case TypeInetProto:
			parts = append(parts, "inet_proto")
		case TypeInetService:
			parts = append(parts, "inet_service")
		case TypeMark:
			parts = append(parts, "mark")
		default:
			parts = append(parts, "type"+itoa(uint64(f)))
		}
	}
	if len(parts) == 0 {
		return "type0"
	}
	return strings.Join(parts, " . ")
}

func align4(n int) int        { return (n + 3) &^ 3 }
func align4u(n uint32) uint32 { return (n + 3) &^ 3 }

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// RangePrefixes returns the fewest prefixes that cover exactly the
// addresses from first to last (of one family, first not after last).
func RangePrefixes(first, last netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for first.IsValid() && first.Compare(last) <= 0 {
		// The largest prefix that starts at first and ends by last.
		bits := first.BitLen()
		for bits > 0 {
			p := netip.PrefixFrom(first, bits-1)
			if p.Masked().Addr() != first || LastAddr(p).Compare(last) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(first, bits)
		out = append(out, p)
		end := LastAddr(p)
		if end == last {
			break
		}
		first = end.Next()
	}
	return out
}

// Jhash is the kernel's jhash() (include/linux/jhash.h, Bob Jenkins'
// lookup3) over k, reading words in host byte order as the kernel does.
func Jhash(k []byte, initval uint32) uint32 {
	rol := func(x uint32, n uint) uint32 { return x<<n | x>>(32-n) }
	a := 0xdeadbeef + uint32(len(k)) + initval
	b, c := a, a
	for len(k) > 12 {
		a += binary.NativeEndian.Uint32(k)
		b += binary.NativeEndian.Uint32(k[4:])
		c += binary.NativeEndian.Uint32(k[8:])
		a -= c
		a ^= rol(c, 4)
		c += b
		b -= a
		b ^= rol(a, 6)
		a += c
		c -= b
		c ^= rol(b, 8)
		b += a
		a -= c
		a ^= rol(c, 16)
		c += b
		b -= a
		b ^= rol(a, 19)
		a += c
		c -= b
		c ^= rol(b, 4)
		b += a
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	var last [12]byte
	copy(last[:], k)
	// The kernel adds the tail bytes as little-endian values.
	a += binary.LittleEndian.Uint32(last[0:])
	b += binary.LittleEndian.Uint32(last[4:])
	c += binary.LittleEndian.Uint32(last[8:])
	c ^= b
	c -= rol(b, 14)
	a ^= c
	a -= rol(c, 11)
	b ^= a
	b -= rol(a, 25)
	c ^= b
	c -= rol(b, 16)
	a ^= c
	a -= rol(c, 4)
	b ^= a
	b -= rol(a, 14)
	c ^= b
	c -= rol(b, 24)
	return c
}

// ReciprocalScale is the kernel's reciprocal_scale: val scaled to [0, n).
func ReciprocalScale(val, n uint32) uint32 { return uint32(uint64(val) * uint64(n) >> 32) }
