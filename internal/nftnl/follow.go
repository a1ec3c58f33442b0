package nftnl

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file works out where a packet goes in a table read back
// ([Table]): starting at a chain (the one a dispatch map sends a service
// address to), it follows a packet whose destination, protocol and port
// are known through the registers of each rule (constants, packet
// fields, random numbers, map lookups, jumps) to the DNATs it may reach.
// It relies on what the expressions do, not on how a backend lays out
// its chains and maps.

// Flow is a packet to follow: its destination address (nil: any of the
// node's addresses), protocol and destination port.
type Flow struct {
	Daddr []byte
	Proto byte
	Dport uint16
}

// FlowOf returns the packet an element key of s stands for, when s is
// keyed by address . protocol . port or by protocol . port (a dispatch
// map); ok is false for any other key.
func (t *Table) FlowOf(s *Set, key []byte) (f Flow, ok bool) {
	fs := s.Key.Fields()
	addrLen := t.addrLen()
	if len(fs) == 3 && (fs[0] == TypeIPAddr || fs[0] == TypeIP6Addr) {
		if len(key) < addrLen {
			return Flow{}, false
		}
		f.Daddr, key, fs = key[:addrLen], key[addrLen:], fs[1:]
	}
	if len(fs) != 2 || fs[0] != TypeInetProto || fs[1] != TypeInetService || len(key) < 8 {
		return Flow{}, false
	}
	f.Proto, f.Dport = key[0], binary.BigEndian.Uint16(key[4:])
	return f, true
}

// Pin is a session-affinity record: a client and the endpoint it sticks
// to.
type Pin struct {
	Client   netip.Addr
	Endpoint netip.AddrPort
}

// Outcome is where a flow may go. Every list is sorted, without
// duplicates.
type Outcome struct {
	// Endpoints are the DNAT targets every source may reach.
	Endpoints []netip.AddrPort
	// Some are DNAT targets only some sources reach: the path to them
	// depends on the packet's source (its address, the node's own
	// traffic, marks).
	Some []netip.AddrPort
	// Affinity is set when a rule on the way records sessions (a
	// dynamic set update); Pins are the records that send a client to
	// one of the endpoints.
	Affinity bool
	Pins     []Pin
	// Verdicts are the other ends met: "drop", "reject".
	Verdicts []string
}

// Follow returns where f may go from chain. Chains whose rules cannot be
// decoded are taken as empty.
func (t *Table) Follow(chain string, f Flow) Outcome {
	ev := &evaluator{t: t, addrLen: t.addrLen(), rules: map[string][]Rule{}}
	var o Outcome
	ev.chain(chain, f, registers{}, 0, false, &o)
	o.Endpoints = uniqueSorted(o.Endpoints, func(a, b netip.AddrPort) int { return a.Compare(b) })
	o.Pins = uniqueSorted(o.Pins, func(a, b Pin) int {
		if c := a.Client.Compare(b.Client); c != 0 {
			return c
		}
		return a.Endpoint.Compare(b.Endpoint)
	})
	o.Some = uniqueSorted(o.Some, func(a, b netip.AddrPort) int { return a.Compare(b) })
	o.Verdicts = uniqueSorted(o.Verdicts, strings.Compare)
	return o
}

func (t *Table) addrLen() int {
	if t.Proto == unix.NFPROTO_IPV6 {
		return 16
	}
	return 4
}

// evaluator holds one Follow's decoded rules.
type evaluator struct {
	t       *Table
	addrLen int
	rules   map[string][]Rule // decoded, by chain
}

// chainRules returns the decoded rules of a chain, none when it does
// not exist or does not decode.
func (ev *evaluator) chainRules(name string) []Rule {
	if rs, ok := ev.rules[name]; ok {
		return rs
	}
	var rs []Rule
	if c := ev.t.Chain(name); c != nil {
		for _, raw := range c.Rules {
			r, err := DecodeExprs(ev.t.Proto, raw)
			if err != nil {
				rs = nil
				break
			}
			rs = append(rs, r)
		}
	}
	ev.rules[name] = rs
	return rs
}

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
	random   // a number in [lo, hi), in host order
	saddr    // part of the packet's source address
)

type chunk struct {
	kind   int
	b      []byte
	lo, hi uint64
}

type registers map[int]chunk

func (r registers) clone() registers {
	out := make(registers, len(r))
	for k, v := range r {
		out[k] = v
	}
	return out
}

// set writes b (padded to whole registers) from register start.
func (r registers) set(start int, b []byte, kind int) {
	for i := 0; i < len(b); i += 4 {
		r[start+i/4] = chunk{kind: kind, b: pad4(b[i:min(len(b), i+4)])}
	}
}

// read returns n registers from start.
func (r registers) read(start, n int) []chunk {
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

// chain evaluates the rules of chain in turn; it returns true when the
// flow surely stopped in it (a verdict no condition guarded). With some
// set, the chain is reached by some sources only.
func (ev *evaluator) chain(chain string, f Flow, in registers, depth int, some bool, o *Outcome) bool {
	if depth > 8 {
		return false
	}
	rules := ev.chainRules(chain)
	if chain == "reject-chain" && len(rules) == 0 {
		o.Verdicts = append(o.Verdicts, "reject")
		return true
	}
	for _, r := range rules {
		if ev.rule(r, f, in.clone(), depth, some, o) {
			return true
		}
	}
	return false
}

// rule evaluates one rule. It returns true when the flow surely ends in
// it.
func (ev *evaluator) rule(r Rule, f Flow, rg registers, depth int, some bool, o *Outcome) bool {
	// Conditions the evaluator cannot decide: cond depends on the
	// packet's source, maybe on chance (a random number, a
	// session-affinity record).
	cond, maybe := some, false
	var results []lookupResult
	var pins []pinLookup
	for _, e := range r {
		switch e := e.(type) {
		case *expr.Immediate:
			rg.set(regIdx(e.Register), e.Data, constant)
		case *expr.Payload:
			if e.OperationType != expr.PayloadLoad {
				continue
			}
			rg.set(regIdx(e.DestRegister), make([]byte, e.Len), unknown)
			ev.payload(rg, e, f)
		case *expr.Meta:
			if e.SourceRegister {
				continue
			}
			switch e.Key {
			case expr.MetaKeyL4PROTO:
				rg.set(regIdx(e.Register), []byte{f.Proto}, constant)
			case expr.MetaKeyNFPROTO:
				rg.set(regIdx(e.Register), []byte{ev.t.Proto}, constant)
			default:
				rg[regIdx(e.Register)] = chunk{}
			}
		case *expr.Numgen:
			rg[regIdx(e.Register)] = chunk{kind: random, lo: uint64(e.Offset), hi: uint64(e.Offset) + uint64(e.Modulus)}
		case *expr.Hash:
			// nft_jhash: the hash of the source registers' bytes,
			// scaled to the modulus, plus the offset, in host order.
			src, ok := constBytes(rg.read(regIdx(e.SourceRegister), int(e.Length+3)/4))
			if e.Type != expr.HashTypeJenkins || !ok || len(src) < int(e.Length) {
				rg.set(regIdx(e.DestRegister), make([]byte, 4), unknown)
				continue
			}
			h := ReciprocalScale(Jhash(src[:e.Length], e.Seed), e.Modulus) + e.Offset
			rg.set(regIdx(e.DestRegister), binary.NativeEndian.AppendUint32(nil, h), constant)
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
			s := ev.t.Set(e.SetName)
			if s == nil {
				cond = true
				continue
			}
			n := int(s.keyLen())
			if n == 0 {
				cond = true
				continue
			}
			key := rg.read(regIdx(e.SourceRegister), (n+3)/4)
			_, known := constBytes(key)
			els := ev.match(s, key)
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
					if el.Verdict != nil && ev.verdict(exprVerdict(el.Verdict), f, rg, depth, cond, maybe, o) {
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
				if s.Dynamic || s.Timeout {
					maybe = true
					if !e.Invert {
						pins = append(pins, pinLookup{s, key})
					}
				} else {
					cond = true
				}
			}
		case *expr.Dynset:
			o.Affinity = true
		case *expr.NAT:
			if e.Type != expr.NATTypeDestNAT {
				continue
			}
			eps := dnatTargets(rg, results, regIdx(e.RegAddrMin), regIdx(e.RegProtoMin), ev.addrLen)
			if cond {
				o.Some = append(o.Some, eps...)
			} else {
				o.Endpoints = append(o.Endpoints, eps...)
			}
			for _, p := range pins {
				for _, c := range ev.pinned(p) {
					for _, ep := range eps {
						o.Pins = append(o.Pins, Pin{c, ep})
					}
				}
			}
			return !cond && !maybe
		case *expr.Reject:
			if !cond {
				o.Verdicts = append(o.Verdicts, "reject")
			}
			return !cond && !maybe
		case *expr.Verdict:
			return ev.verdict(e, f, rg, depth, cond, maybe, o)
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

// exprVerdict returns a map element's verdict as a verdict expression.
func exprVerdict(v *Verdict) *expr.Verdict {
	return &expr.Verdict{Kind: expr.VerdictKind(v.Code), Chain: v.Chain}
}

// verdict applies a verdict; it returns true when the flow surely ends.
func (ev *evaluator) verdict(v *expr.Verdict, f Flow, rg registers, depth int, cond, maybe bool, o *Outcome) bool {
	sure := !cond && !maybe
	switch v.Kind {
	case expr.VerdictJump, expr.VerdictGoto:
		ended := ev.chain(v.Chain, f, rg, depth+1, cond, o)
		return sure && (ended || v.Kind == expr.VerdictGoto)
	case expr.VerdictDrop:
		if !cond {
			o.Verdicts = append(o.Verdicts, "drop")
		}
		return sure
	case expr.VerdictAccept, expr.VerdictReturn:
		return sure
	}
	return false
}

// payload loads a field of the flow, when it is one the flow knows.
func (ev *evaluator) payload(rg registers, e *expr.Payload, f Flow) {
	d := regIdx(e.DestRegister)
	switch e.Base {
	case expr.PayloadBaseNetworkHeader:
		src, dst := uint32(12), uint32(16)
		if ev.addrLen == 16 {
			src, dst = 8, 24
		}
		switch {
		case e.Offset == src && int(e.Len) == ev.addrLen:
			rg.set(d, make([]byte, e.Len), saddr)
		case e.Offset == dst && int(e.Len) == ev.addrLen && f.Daddr != nil:
			rg.set(d, f.Daddr, constant)
		}
	case expr.PayloadBaseTransportHeader:
		if e.Offset == 2 && e.Len == 2 {
			rg.set(d, binary.BigEndian.AppendUint16(nil, f.Dport), constant)
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
	s   *Set
	key []chunk
}

// pinned returns the client addresses of the records the lookup may
// find.
func (ev *evaluator) pinned(p pinLookup) []netip.Addr {
	var out []netip.Addr
	for _, el := range ev.match(p.s, p.key) {
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
func dnatTargets(rg registers, results []lookupResult, addr, port, addrLen int) []netip.AddrPort {
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
func (ev *evaluator) match(s *Set, key []chunk) []Elem {
	els := ev.t.Elems[s.Name]
	var out []Elem
	if !s.Interval {
		for _, el := range els {
			if matchKey(el.Key, key) {
				out = append(out, el)
			}
		}
		return out
	}
	// An interval set: an element with a key end (a concatenation)
	// covers the keys from its key to that end; any other start element
	// covers the keys up to the next larger element, in memcmp order.
	// The registers may hold any key between lo and hi.
	lo, hi := keyBounds(key)
	sorted := slices.Clone(els)
	slices.SortStableFunc(sorted, func(a, b Elem) int { return bytes.Compare(a.Key, b.Key) })
	for i, el := range sorted {
		if el.IntervalEnd {
			continue
		}
		if el.KeyEnd != nil {
			if bytes.Compare(el.Key, hi) <= 0 && bytes.Compare(el.KeyEnd, lo) >= 0 {
				out = append(out, el)
			}
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
// not always visible, and the constant parts of a key are what tell
// groups apart.
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
			if v < c.lo || v >= c.hi {
				return false
			}
		}
	}
	return true
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
