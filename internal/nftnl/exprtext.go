package nftnl

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file prints rule expressions in libnftnl's debug form, e.g.
//
//	[ payload load 4b @ network header + 16 => reg 1 ] [ lookup reg 1 set service-ips dreg 0 ]
//
// Registers print as 32-bit registers (8-23; 0 is the verdict register):
// a kernel dump names a register that starts a 16-byte group by the
// 128-bit register number (1-4), which prints as the 32-bit one it is.
// Data prints as 32-bit words in host byte order, as libnftnl does.

// exprAttrs is an expression's attributes by type: numbers decoded big
// endian, nested ones (data) kept raw.
type exprAttrs map[uint16][]byte

func (a exprAttrs) has(t uint16) bool { return a[t] != nil }

func (a exprAttrs) u32(t uint16) uint32 {
	if v := a[t]; len(v) >= 4 {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (a exprAttrs) u64(t uint16) uint64 {
	if v := a[t]; len(v) >= 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// reg returns a register attribute as a 32-bit register number.
func (a exprAttrs) reg(t uint16) uint32 {
	r := a.u32(t)
	if r >= 1 && r <= 4 {
		return unix.NFT_REG32_00 + 4*(r-1)
	}
	return r
}

func (a exprAttrs) str(t uint16) string { return strings.TrimRight(string(a[t]), "\x00") }

// formatExprs writes the expressions of an NFTA_RULE_EXPRESSIONS
// attribute.
func formatExprs(sb *strings.Builder, raw []byte) error {
	ad, err := netlink.NewAttributeDecoder(raw)
	if err != nil {
		return err
	}
	first := true
	for ad.Next() {
		var name string
		attrs := exprAttrs{}
		ad.Nested(func(ed *netlink.AttributeDecoder) error {
			for ed.Next() {
				switch ed.Type() {
				case unix.NFTA_EXPR_NAME:
					name = ed.String()
				case unix.NFTA_EXPR_DATA:
					ed.Nested(func(dd *netlink.AttributeDecoder) error {
						for dd.Next() {
							b := dd.Bytes()
							if b == nil {
								b = []byte{}
							}
							attrs[dd.Type()] = b
						}
						return nil
					})
				}
			}
			return nil
		})
		if !first {
			sb.WriteByte(' ')
		}
		first = false
		sb.WriteString("[ " + name + " ")
		formatExpr(sb, name, attrs)
		sb.WriteString(" ]")
	}
	return ad.Err()
}

func formatExpr(sb *strings.Builder, name string, a exprAttrs) {
	p := func(format string, args ...any) { fmt.Fprintf(sb, format, args...) }
	switch name {
	case "payload":
		base := [...]string{"link", "network", "transport", "inner", "tunnel"}
		b := a.u32(unix.NFTA_PAYLOAD_BASE)
		bn := "base" + itoa(uint64(b))
		if int(b) < len(base) {
			bn = base[b]
		}
		if a.has(unix.NFTA_PAYLOAD_SREG) {
			p("write reg %d => %db @ %s header + %d csum_type %d csum_off %d", a.reg(unix.NFTA_PAYLOAD_SREG),
				a.u32(unix.NFTA_PAYLOAD_LEN), bn, a.u32(unix.NFTA_PAYLOAD_OFFSET),
				a.u32(unix.NFTA_PAYLOAD_CSUM_TYPE), a.u32(unix.NFTA_PAYLOAD_CSUM_OFFSET))
			return
		}
		p("load %db @ %s header + %d => reg %d", a.u32(unix.NFTA_PAYLOAD_LEN), bn,
			a.u32(unix.NFTA_PAYLOAD_OFFSET), a.reg(unix.NFTA_PAYLOAD_DREG))
	case "meta":
		key := metaKey(a.u32(unix.NFTA_META_KEY))
		if a.has(unix.NFTA_META_SREG) {
			p("set %s with reg %d", key, a.reg(unix.NFTA_META_SREG))
			return
		}
		p("load %s => reg %d", key, a.reg(unix.NFTA_META_DREG))
	case "cmp":
		p("%s reg %d ", cmpOp(a.u32(unix.NFTA_CMP_OP)), a.reg(unix.NFTA_CMP_SREG))
		sb.WriteString(dataText(a[unix.NFTA_CMP_DATA]))
	case "bitwise":
		p("reg %d = ( reg %d & %s ) ^ %s", a.reg(unix.NFTA_BITWISE_DREG), a.reg(unix.NFTA_BITWISE_SREG),
			dataText(a[unix.NFTA_BITWISE_MASK]), dataText(a[unix.NFTA_BITWISE_XOR]))
	case "lookup":
		p("reg %d set %s", a.reg(unix.NFTA_LOOKUP_SREG), a.str(unix.NFTA_LOOKUP_SET))
		if a.has(unix.NFTA_LOOKUP_DREG) {
			p(" dreg %d", a.reg(unix.NFTA_LOOKUP_DREG))
		}
		if a.u32(unix.NFTA_LOOKUP_FLAGS)&unix.NFT_LOOKUP_F_INV != 0 {
			sb.WriteString(" invert")
		}
	case "immediate":
		p("reg %d %s", a.reg(unix.NFTA_IMMEDIATE_DREG), dataText(a[unix.NFTA_IMMEDIATE_DATA]))
	case "numgen":
		typ := "inc"
		if a.u32(unix.NFTA_NG_TYPE) == unix.NFT_NG_RANDOM {
			typ = "random"
		}
		p("reg %d = %s mod %d offset %d", a.reg(unix.NFTA_NG_DREG), typ, a.u32(unix.NFTA_NG_MODULUS), a.u32(unix.NFTA_NG_OFFSET))
	case "hash":
		if a.u32(unix.NFTA_HASH_TYPE) == unix.NFT_HASH_SYM {
			p("reg %d = symhash() %% mod %d", a.reg(unix.NFTA_HASH_DREG), a.u32(unix.NFTA_HASH_MODULUS))
		} else {
			p("reg %d = jhash(reg %d, %d, 0x%x) %% mod %d", a.reg(unix.NFTA_HASH_DREG), a.reg(unix.NFTA_HASH_SREG),
				a.u32(unix.NFTA_HASH_LEN), a.u32(unix.NFTA_HASH_SEED), a.u32(unix.NFTA_HASH_MODULUS))
		}
		if o := a.u32(unix.NFTA_HASH_OFFSET); o != 0 {
			p(" offset %d", o)
		}
	case "nat":
		typ := "snat"
		if a.u32(unix.NFTA_NAT_TYPE) == unix.NFT_NAT_DNAT {
			typ = "dnat"
		}
		p("%s %s", typ, protoName(byte(a.u32(unix.NFTA_NAT_FAMILY))))
		regs(sb, a, []regAttr{{unix.NFTA_NAT_REG_ADDR_MIN, "addr_min"}, {unix.NFTA_NAT_REG_ADDR_MAX, "addr_max"},
			{unix.NFTA_NAT_REG_PROTO_MIN, "proto_min"}, {unix.NFTA_NAT_REG_PROTO_MAX, "proto_max"}})
		if f := a.u32(unix.NFTA_NAT_FLAGS); f != 0 {
			p(" flags 0x%x", f)
		}
	case "masq", "redir":
		lo, hi, flags := uint16(unix.NFTA_MASQ_REG_PROTO_MIN), uint16(unix.NFTA_MASQ_REG_PROTO_MAX), uint16(unix.NFTA_MASQ_FLAGS)
		if name == "redir" {
			lo, hi, flags = unix.NFTA_REDIR_REG_PROTO_MIN, unix.NFTA_REDIR_REG_PROTO_MAX, unix.NFTA_REDIR_FLAGS
		}
		p("flags 0x%x", a.u32(flags))
		regs(sb, a, []regAttr{{lo, "proto_min"}, {hi, "proto_max"}})
	case "reject":
		var code byte
		if v := a[unix.NFTA_REJECT_ICMP_CODE]; len(v) > 0 {
			code = v[0]
		}
		p("type %d code %d", a.u32(unix.NFTA_REJECT_TYPE), code)
	case "ct":
		key := ctKey(a.u32(unix.NFTA_CT_KEY))
		if a.has(unix.NFTA_CT_SREG) {
			p("set %s with reg %d", key, a.reg(unix.NFTA_CT_SREG))
		} else {
			p("load %s => reg %d", key, a.reg(unix.NFTA_CT_DREG))
		}
		if v := a[unix.NFTA_CT_DIRECTION]; len(v) > 0 {
			p(" , dir %s", [...]string{"original", "reply"}[v[0]&1])
		}
	case "fib":
		var in []string
		f := a.u32(unix.NFTA_FIB_FLAGS)
		for _, fl := range []struct {
			bit  uint32
			name string
		}{{unix.NFTA_FIB_F_SADDR, "saddr"}, {unix.NFTA_FIB_F_DADDR, "daddr"}, {unix.NFTA_FIB_F_MARK, "mark"},
			{unix.NFTA_FIB_F_IIF, "iif"}, {unix.NFTA_FIB_F_OIF, "oif"}} {
			if f&fl.bit != 0 {
				in = append(in, fl.name)
			}
		}
		res := [...]string{"unspec", "oif", "oifname", "type"}
		r := a.u32(unix.NFTA_FIB_RESULT)
		rn := "result" + itoa(uint64(r))
		if int(r) < len(res) {
			rn = res[r]
		}
		if f&unix.NFTA_FIB_F_PRESENT != 0 {
			rn += " present"
		}
		p("%s %s => reg %d", strings.Join(in, " . "), rn, a.reg(unix.NFTA_FIB_DREG))
	case "dynset":
		ops := [...]string{"add", "update", "delete"}
		o := a.u32(unix.NFTA_DYNSET_OP)
		on := "op" + itoa(uint64(o))
		if int(o) < len(ops) {
			on = ops[o]
		}
		p("%s reg_key %d set %s", on, a.reg(unix.NFTA_DYNSET_SREG_KEY), a.str(unix.NFTA_DYNSET_SET_NAME))
		if a.has(unix.NFTA_DYNSET_SREG_DATA) {
			p(" sreg_data %d", a.reg(unix.NFTA_DYNSET_SREG_DATA))
		}
		if a.has(unix.NFTA_DYNSET_TIMEOUT) {
			p(" timeout %dms", a.u64(unix.NFTA_DYNSET_TIMEOUT))
		}
		if a.has(unix.NFTA_DYNSET_EXPR) {
			sb.WriteString(" expr ...")
		}
	case "counter":
		p("pkts %d bytes %d", a.u64(unix.NFTA_COUNTER_PACKETS), a.u64(unix.NFTA_COUNTER_BYTES))
	case "range":
		op := "eq"
		if a.u32(unix.NFTA_RANGE_OP) == 1 {
			op = "neq"
		}
		p("%s reg %d %s %s", op, a.reg(unix.NFTA_RANGE_SREG), dataText(a[unix.NFTA_RANGE_FROM_DATA]), dataText(a[unix.NFTA_RANGE_TO_DATA]))
	default:
		var types []int
		for t := range a {
			types = append(types, int(t))
		}
		p("(%d attributes)", len(types))
	}
}

// regAttr is an attribute that names a register, and its name in text.
type regAttr struct {
	typ  uint16
	name string
}

// regs writes " name reg N" for each register attribute present.
func regs(sb *strings.Builder, a exprAttrs, which []regAttr) {
	for _, w := range which {
		if a.has(w.typ) {
			fmt.Fprintf(sb, " %s reg %d", w.name, a.reg(w.typ))
		}
	}
}

// dataText prints an NFTA_DATA attribute (the nested value or verdict).
func dataText(raw []byte) string {
	ad, err := netlink.NewAttributeDecoder(raw)
	if err != nil {
		return "?"
	}
	ad.ByteOrder = binary.BigEndian
	out := "?"
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_DATA_VALUE:
			out = words(ad.Bytes())
		case unix.NFTA_DATA_VERDICT:
			out = verdictText(decodeVerdict(ad))
		}
	}
	return out
}

// words prints v as libnftnl does: 32-bit words in host byte order, the
// last one zero-padded.
func words(v []byte) string {
	var parts []string
	for len(v) > 0 {
		var w [4]byte
		n := copy(w[:], v)
		parts = append(parts, fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(w[:])))
		v = v[n:]
	}
	return strings.Join(parts, " ")
}

func cmpOp(op uint32) string {
	switch op {
	case unix.NFT_CMP_EQ:
		return "eq"
	case unix.NFT_CMP_NEQ:
		return "neq"
	case unix.NFT_CMP_LT:
		return "lt"
	case unix.NFT_CMP_LTE:
		return "lte"
	case unix.NFT_CMP_GT:
		return "gt"
	case unix.NFT_CMP_GTE:
		return "gte"
	}
	return "op" + itoa(uint64(op))
}

func metaKey(k uint32) string {
	switch k {
	case unix.NFT_META_LEN:
		return "len"
	case unix.NFT_META_PROTOCOL:
		return "protocol"
	case unix.NFT_META_MARK:
		return "mark"
	case unix.NFT_META_IIF:
		return "iif"
	case unix.NFT_META_OIF:
		return "oif"
	case unix.NFT_META_IIFNAME:
		return "iifname"
	case unix.NFT_META_OIFNAME:
		return "oifname"
	case unix.NFT_META_NFPROTO:
		return "nfproto"
	case unix.NFT_META_L4PROTO:
		return "l4proto"
	case unix.NFT_META_PKTTYPE:
		return "pkttype"
	case unix.NFT_META_CGROUP:
		return "cgroup"
	case unix.NFT_META_PRANDOM:
		return "prandom"
	}
	return "key" + itoa(uint64(k))
}

func ctKey(k uint32) string {
	switch k {
	case unix.NFT_CT_STATE:
		return "state"
	case unix.NFT_CT_DIRECTION:
		return "direction"
	case unix.NFT_CT_STATUS:
		return "status"
	case unix.NFT_CT_MARK:
		return "mark"
	case unix.NFT_CT_EXPIRATION:
		return "expiration"
	case unix.NFT_CT_PROTOCOL:
		return "protocol"
	case unix.NFT_CT_SRC:
		return "src"
	case unix.NFT_CT_DST:
		return "dst"
	case unix.NFT_CT_PROTO_SRC:
		return "proto_src"
	case unix.NFT_CT_PROTO_DST:
		return "proto_dst"
	case unix.NFT_CT_ZONE:
		return "zone"
	}
	return "key" + itoa(uint64(k))
}
