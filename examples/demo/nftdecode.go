package main

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file works out where a service's packets go, from the rules as
// netlink returns them: starting at the chain a dispatch map sends a
// service address to, it follows a packet whose destination, protocol and
// port are known through the registers of each rule (constants, packet
// fields, random numbers, map lookups, jumps) to the DNATs it may reach.
// It relies on what the expressions do, not on how the backend lays out
// its chains and maps, which the backend is free to change.

// regIdx turns a register number as the kernel dumps it into the index of
// a 32-bit register (NFT_REG_1..4 alias NFT_REG32_00, 04, 08, 12).
func regIdx(r uint32) int {
	switch {
	case r >= unix.NFT_REG32_00:
		return int(r - unix.NFT_REG32_00)
	case r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4:
		return int(r-unix.NFT_REG_1) * 4
	}
	return -1
}

// What a 32-bit register holds.
const (
	unknown  = iota
	constant // b
	random   // a number in [lo, hi), in host order unless be
	saddr    // part of the packet's source address
)

type chunk struct {
	kind   int
	b      []byte
	lo, hi uint64
	be     bool
}

type regs map[int]chunk

func (r regs) clone() regs {
	out := make(regs, len(r))
	for k, v := range r {
		out[k] = v
	}
	return out
}

// set writes b (padded to whole registers) from register start.
func (r regs) set(start int, b []byte, kind int) {
	for i := 0; i < len(b); i += 4 {
		r[start+i/4] = chunk{kind: kind, b: pad4(b[i:min(len(b), i+4)])}
	}
}

// read returns n registers from start.
func (r regs) read(start, n int) []chunk {
	out := make([]chunk, n)
	for i := range out {
		out[i] = r[start+i]
	}
	return out
}

// constBytes returns the bytes of chunks that are all constant.
func constBytes(cs []chunk) ([]byte, bool) {
	var b []byte
	for _, c := range cs {
		if c.kind != constant {
			return nil, false
		}
		b = append(b, c.b...)
	}
	return b, true
}

// flow is a packet to follow: its destination (nil when any node
// address), protocol and destination port.
type flow struct {
	daddr []byte
	proto byte
	dport uint16
}

// pin is a session-affinity record: a client and the endpoint it sticks
// to.
type pin struct {
	client   netip.Addr
	endpoint netip.AddrPort
}

// outcome is where a flow may go.
type outcome struct {
	endpoints []netip.AddrPort
	pins      []pin
	affinity  bool
	// some are endpoints only some sources are sent to: the path to them
	// depends on the packet's source (its address, the node's own
	// traffic, marks).
	some     []netip.AddrPort
	verdicts []string // "reject", "drop"
}

// tableData is a table's chains, sets and elements, by name.
type tableData struct {
	addrLen int
	family  byte // NFPROTO_IPV4 or NFPROTO_IPV6
	rules   map[string][]*gnft.Rule
	sets    map[string]*gnft.Set
	elems   map[string][]gnft.SetElement
}

// follow returns where f may go from chain.
func (td *tableData) follow(chain string, f flow) outcome {
	var o outcome
	td.chain(chain, f, regs{}, 0, false, &o)
	o.endpoints = uniqueSorted(o.endpoints, func(a, b netip.AddrPort) int { return a.Compare(b) })
	o.pins = uniqueSorted(o.pins, func(a, b pin) int {
		if c := a.client.Compare(b.client); c != 0 {
			return c
		}
		return a.endpoint.Compare(b.endpoint)
	})
	o.some = uniqueSorted(o.some, func(a, b netip.AddrPort) int { return a.Compare(b) })
	o.verdicts = uniqueSorted(o.verdicts, func(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) })
	return o
}

// chain evaluates the rules of chain in turn; it returns true when the
// flow surely stopped in it (a verdict no condition guarded). With some
// set, the chain is reached by some sources only.
func (td *tableData) chain(chain string, f flow, in regs, depth int, some bool, o *outcome) bool {
	if depth > 8 {
		return false
	}
	if chain == "reject-chain" && len(td.rules[chain]) == 0 {
		o.verdicts = append(o.verdicts, "reject")
		return true
	}
	for _, r := range td.rules[chain] {
		if td.rule(r, f, in.clone(), depth, some, o) {
			return true
		}
	}
	return false
}

// rule evaluates one rule. It returns true when the flow surely ends in
// it.
func (td *tableData) rule(r *gnft.Rule, f flow, rg regs, depth int, some bool, o *outcome) bool {
	// Conditions the evaluator cannot decide: cond depends on the
	// packet's source, maybe on chance (a random number, a
	// session-affinity record).
	cond, maybe := some, false
	var results []lookupResult
	var pins []pinLookup
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Immediate:
			rg.set(regIdx(e.Register), e.Data, constant)
		case *expr.Payload:
			if e.OperationType != expr.PayloadLoad {
				continue
			}
			rg.set(regIdx(e.DestRegister), make([]byte, e.Len), unknown)
			td.payload(rg, e, f)
		case *expr.Meta:
			if e.SourceRegister {
				continue
			}
			switch e.Key {
			case expr.MetaKeyL4PROTO:
				rg.set(regIdx(e.Register), []byte{f.proto}, constant)
			case expr.MetaKeyNFPROTO:
				rg.set(regIdx(e.Register), []byte{td.family}, constant)
			default:
				rg[regIdx(e.Register)] = chunk{}
			}
		case *expr.Numgen:
			rg[regIdx(e.Register)] = chunk{kind: random, lo: uint64(e.Offset), hi: uint64(e.Offset) + uint64(e.Modulus)}
		case *expr.Bitwise:
			src := rg.read(regIdx(e.SourceRegister), int(e.Len+3)/4)
			if b, ok := constBytes(src); ok && len(e.Mask) == len(e.Xor) && len(e.Mask) <= len(b) {
				out := slices.Clone(b[:len(e.Mask)])
				for i := range out {
					out[i] = out[i]&e.Mask[i] ^ e.Xor[i]
				}
				rg.set(regIdx(e.DestRegister), out, constant)
			} else {
				rg.set(regIdx(e.DestRegister), make([]byte, e.Len), unknown)
			}
		case *expr.Cmp:
			in := rg.read(regIdx(e.Register), (len(e.Data)+3)/4)
			got, ok := constBytes(in)
			if !ok {
				if slices.ContainsFunc(in, func(c chunk) bool { return c.kind == random }) {
					maybe = true
				} else {
					cond = true
				}
				continue
			}
			if !cmpHolds(e.Op, got[:len(e.Data)], e.Data) {
				return false
			}
		case *expr.Lookup:
			s := td.sets[e.SetName]
			if s == nil {
				cond = true
				continue
			}
			n := td.keyLen(s)
			if n == 0 {
				cond = true
				continue
			}
			key := rg.read(regIdx(e.SourceRegister), (n+3)/4)
			_, known := constBytes(key)
			els := td.match(s, key)
			switch {
			case e.IsDestRegSet && regIdx(e.DestRegister) < 0: // a verdict map
				if !known {
					cond = true
					continue
				}
				if len(els) == 0 {
					return false
				}
				for _, el := range els {
					if v := elemVerdict(s, el); v != nil && td.verdict(v, f, rg, depth, cond, maybe, o) {
						return true
					}
				}
			case e.IsDestRegSet:
				if known && len(els) == 0 {
					return false
				}
				vals := make([][]byte, 0, len(els))
				for _, el := range els {
					vals = append(vals, el.Val)
				}
				results = append(results, lookupResult{start: regIdx(e.DestRegister), vals: vals})
				if !known {
					maybe = true
				}
			default:
				if known {
					if (len(els) > 0) == e.Invert {
						return false
					}
					continue
				}
				// A set the packet path writes (dynamic, with timeouts)
				// holds session-affinity records; any other set keyed by
				// the packet sorts sources.
				if s.Dynamic || s.HasTimeout {
					maybe = true
					if !e.Invert {
						pins = append(pins, pinLookup{s, key})
					}
				} else {
					cond = true
				}
			}
		case *expr.Dynset:
			o.affinity = true
		case *expr.NAT:
			if e.Type != expr.NATTypeDestNAT {
				continue
			}
			eps := dnatTargets(rg, results, regIdx(e.RegAddrMin), regIdx(e.RegProtoMin), td.addrLen)
			if cond {
				o.some = append(o.some, eps...)
			} else {
				o.endpoints = append(o.endpoints, eps...)
			}
			for _, p := range pins {
				for _, c := range td.pinned(p) {
					for _, ep := range eps {
						o.pins = append(o.pins, pin{c, ep})
					}
				}
			}
			return !cond && !maybe
		case *expr.Reject:
			if !cond {
				o.verdicts = append(o.verdicts, "reject")
			}
			return !cond && !maybe
		case *expr.Verdict:
			return td.verdict(e, f, rg, depth, cond, maybe, o)
		default:
			// Anything else that writes a register (fib, ct, ...) leaves
			// it unknown; most of them are followed by a cmp.
			if d, ok := destRegister(e); ok {
				rg[d] = chunk{}
			}
		}
	}
	return false
}

// verdict applies a verdict; it returns true when the flow surely ends.
func (td *tableData) verdict(v *expr.Verdict, f flow, rg regs, depth int, cond, maybe bool, o *outcome) bool {
	sure := !cond && !maybe
	switch v.Kind {
	case expr.VerdictJump, expr.VerdictGoto:
		ended := td.chain(v.Chain, f, rg, depth+1, cond, o)
		return sure && (ended || v.Kind == expr.VerdictGoto)
	case expr.VerdictDrop:
		if !cond {
			o.verdicts = append(o.verdicts, "drop")
		}
		return sure
	case expr.VerdictAccept, expr.VerdictReturn:
		return sure
	}
	return false
}

// payload loads a field of the flow, when it is one the flow knows.
func (td *tableData) payload(rg regs, e *expr.Payload, f flow) {
	d := regIdx(e.DestRegister)
	switch e.Base {
	case expr.PayloadBaseNetworkHeader:
		src, dst := uint32(12), uint32(16)
		if td.addrLen == 16 {
			src, dst = 8, 24
		}
		switch {
		case e.Offset == src && int(e.Len) == td.addrLen:
			rg.set(d, make([]byte, e.Len), saddr)
		case e.Offset == dst && int(e.Len) == td.addrLen && f.daddr != nil:
			rg.set(d, f.daddr, constant)
		}
	case expr.PayloadBaseTransportHeader:
		if e.Offset == 2 && e.Len == 2 {
			rg.set(d, binary.BigEndian.AppendUint16(nil, f.dport), constant)
		}
	}
}

// destRegister returns the register an expression writes, for the kinds
// the evaluator does not model.
func destRegister(e expr.Any) (int, bool) {
	switch e := e.(type) {
	case *expr.Fib:
		return regIdx(e.Register), true
	case *expr.Ct:
		if !e.SourceRegister {
			return regIdx(e.Register), true
		}
	case *expr.Exthdr:
		return regIdx(e.DestRegister), true
	case *expr.Hash:
		return regIdx(e.DestRegister), true
	}
	return 0, false
}

func cmpHolds(op expr.CmpOp, got, want []byte) bool {
	c := bytes.Compare(got, want)
	switch op {
	case expr.CmpOpEq:
		return c == 0
	case expr.CmpOpNeq:
		return c != 0
	case expr.CmpOpLt:
		return c < 0
	case expr.CmpOpLte:
		return c <= 0
	case expr.CmpOpGt:
		return c > 0
	case expr.CmpOpGte:
		return c >= 0
	}
	return true
}

// lookupResult is the data of the map elements a lookup may have found,
// written to consecutive registers from start.
type lookupResult struct {
	start int
	vals  [][]byte
}

// pinLookup is a membership test of a set keyed partly by the source
// address: a session-affinity record.
type pinLookup struct {
	s   *gnft.Set
	key []chunk
}

// pinned returns the client addresses of the records the lookup may
// find.
func (td *tableData) pinned(p pinLookup) []netip.Addr {
	var out []netip.Addr
	for _, el := range td.match(p.s, p.key) {
		var a []byte
		for i, c := range p.key {
			if c.kind == saddr && 4*i+4 <= len(el.Key) {
				a = append(a, el.Key[4*i:4*i+4]...)
			}
		}
		if addr, ok := netip.AddrFromSlice(a); ok {
			out = append(out, addr)
		}
	}
	return out
}

// dnatTargets returns the endpoints a DNAT from the address register
// addr and the port register port may go to: the data of a lookup, or
// constants.
func dnatTargets(rg regs, results []lookupResult, addr, port, addrLen int) []netip.AddrPort {
	for _, r := range slices.Backward(results) {
		if addr < r.start || port < r.start {
			continue
		}
		off, poff := 4*(addr-r.start), 4*(port-r.start)
		var out []netip.AddrPort
		for _, v := range r.vals {
			if off+addrLen > len(v) || poff+2 > len(v) {
				continue
			}
			a, _ := netip.AddrFromSlice(v[off : off+addrLen])
			out = append(out, netip.AddrPortFrom(a, binary.BigEndian.Uint16(v[poff:])))
		}
		return out
	}
	a, ok := constBytes(rg.read(addr, (addrLen+3)/4))
	p, pok := constBytes(rg.read(port, 1))
	if !ok || !pok {
		return nil
	}
	ip, _ := netip.AddrFromSlice(a[:addrLen])
	return []netip.AddrPort{netip.AddrPortFrom(ip, binary.BigEndian.Uint16(p))}
}

// match returns the elements of s whose key the registers may hold.
func (td *tableData) match(s *gnft.Set, key []chunk) []gnft.SetElement {
	els := td.elems[s.Name]
	var out []gnft.SetElement
	if !s.Interval {
		for _, el := range els {
			if matchKey(el.Key, key) {
				out = append(out, el)
			}
		}
		return out
	}
	// An interval set: each start element covers the keys up to the next
	// larger element, in memcmp order. The registers may hold any key
	// between lo and hi.
	lo, hi := keyBounds(key)
	sorted := slices.Clone(els)
	slices.SortStableFunc(sorted, func(a, b gnft.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	for i, el := range sorted {
		if el.IntervalEnd {
			continue
		}
		var end []byte
		for _, next := range sorted[i+1:] {
			if bytes.Compare(next.Key, el.Key) > 0 {
				end = next.Key
				break
			}
		}
		if bytes.Compare(el.Key, hi) <= 0 && (end == nil || bytes.Compare(end, lo) > 0) {
			out = append(out, el)
		}
	}
	return out
}

// keyBounds returns the smallest and largest key registers may hold, in
// memcmp order. A random number counts as any value: its byte order is
// not always visible (google/nftables does not list byteorder
// expressions), and the constant parts of a key are what tell groups
// apart.
func keyBounds(key []chunk) (lo, hi []byte) {
	free := false
	for _, c := range key {
		if c.kind == constant && !free {
			lo, hi = append(lo, c.b...), append(hi, c.b...)
			continue
		}
		free = true
		lo, hi = append(lo, 0, 0, 0, 0), append(hi, 0xff, 0xff, 0xff, 0xff)
	}
	return lo, hi
}

// matchKey reports whether registers holding key may equal k.
func matchKey(k []byte, key []chunk) bool {
	for i, c := range key {
		if 4*i+4 > len(k) {
			break
		}
		b := k[4*i : 4*i+4]
		switch c.kind {
		case constant:
			if !bytes.Equal(b, c.b) {
				return false
			}
		case random:
			v := uint64(binary.NativeEndian.Uint32(b))
			if c.be {
				v = uint64(binary.BigEndian.Uint32(b))
			}
			if v < c.lo || v >= c.hi {
				return false
			}
		}
	}
	return true
}

// keyLen returns the length of a set's key in bytes, each component of a
// concatenation padded to 4; 0 when unknown.
func (td *tableData) keyLen(s *gnft.Set) int {
	n := 0
	for _, t := range td.keyTypes(s) {
		n += (int(t.Bytes) + 3) / 4 * 4
	}
	return n
}

func pad4(b []byte) []byte {
	out := make([]byte, 4)
	copy(out, b)
	return out
}

func uniqueSorted[T any](s []T, cmp func(a, b T) int) []T {
	slices.SortFunc(s, cmp)
	return slices.CompactFunc(s, func(a, b T) bool { return cmp(a, b) == 0 })
}
