package main

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// epVal is addr . port map data.
func epVal(s string) []byte {
	ap := netip.MustParseAddrPort(s)
	return append(ap.Addr().AsSlice(), byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
}

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

// Registers as the kernel dumps them: NFT_REG32_00 as NFT_REG_1.
const (
	r0 = unix.NFT_REG_1
	r1 = unix.NFT_REG32_01
	r2 = unix.NFT_REG32_02
	r3 = unix.NFT_REG32_03
)

// TestFollow checks, without root, that the evaluator finds where a
// service's packets go whatever the map layout: a group . index map, an
// interval map of random-number ranges, an interval map keyed by the
// packet's destination, constant DNATs with session-affinity records, and
// conditions on what the evaluator cannot know.
func TestFollow(t *testing.T) {
	dnat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: r2, RegProtoMin: r3, Specified: true}
	web := flow{daddr: []byte{10, 96, 0, 10}, proto: unix.IPPROTO_TCP, dport: 80}
	rule := func(e ...expr.Any) *gnft.Rule { return &gnft.Rule{Exprs: e} }
	for _, tc := range []struct {
		name  string
		sets  []*gnft.Set
		elems map[string][]gnft.SetElement
		rules map[string][]*gnft.Rule
		want  []netip.AddrPort
		pins  []pin
		some  []netip.AddrPort
	}{{
		name: "group . index",
		sets: []*gnft.Set{{Name: "eps", IsMap: true, KeyType: gnft.MustConcatSetType(gnft.TypeMark, gnft.TypeMark)}},
		elems: map[string][]gnft.SetElement{"eps": {
			{Key: append(ne32(10), ne32(0)...), Val: epVal("10.244.1.2:8080")},
			{Key: append(ne32(10), ne32(1)...), Val: epVal("10.244.2.2:8080")},
			{Key: append(ne32(11), ne32(0)...), Val: epVal("10.244.9.9:8080")}, // another group
		}},
		rules: map[string][]*gnft.Rule{"start": {
			rule(&expr.Verdict{Kind: expr.VerdictJump, Chain: "mark"}),
			rule(&expr.Immediate{Register: r0, Data: ne32(10)},
				&expr.Numgen{Register: r1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: r0, DestRegister: r2, IsDestRegSet: true, SetName: "eps"},
				dnat),
		}, "mark": {
			rule(&expr.Meta{Key: expr.MetaKeyMARK, Register: r0}, &expr.Cmp{Op: expr.CmpOpNeq, Register: r0, Data: ne32(0)}),
		}},
		want: aps("10.244.1.2:8080", "10.244.2.2:8080"),
	}, {
		name: "ranges keyed by the destination",
		sets: []*gnft.Set{{Name: "eps", IsMap: true, Interval: true, KeyType: gnft.TypeIP6Addr}},
		elems: map[string][]gnft.SetElement{"eps": { // as the kernel lists them: descending
			{Key: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0xff, 0xff, 0xff, 0xff}, IntervalEnd: true},
			{Key: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0}, Val: epVal("10.244.9.9:8080")},
			{Key: []byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0, 0xff, 0xff, 0xff, 0xff}, IntervalEnd: true},
			{Key: []byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0, 0x80, 0, 0, 0}, Val: epVal("10.244.2.2:8080")},
			{Key: []byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0, 0x7f, 0xff, 0xff, 0xff}, IntervalEnd: true},
			{Key: []byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0}, Val: epVal("10.244.1.2:8080")},
		}},
		rules: map[string][]*gnft.Rule{"start": {
			rule(&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r1},
				&expr.Payload{DestRegister: r2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Numgen{Register: r3, Modulus: 0xffff, Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: r0, DestRegister: r2, IsDestRegSet: true, SetName: "eps"},
				dnat),
		}},
		want: aps("10.244.1.2:8080", "10.244.2.2:8080"),
	}, {
		name: "affinity with constant endpoints",
		sets: []*gnft.Set{{Name: "aff", HasTimeout: true, Dynamic: true, KeyType: gnft.MustConcatSetType(gnft.TypeMark, gnft.TypeIPAddr)}},
		elems: map[string][]gnft.SetElement{"aff": {
			{Key: append(ne32(7), 10, 244, 1, 2)},
			{Key: append(ne32(8), 10, 244, 1, 3)}, // another endpoint's record
		}},
		rules: map[string][]*gnft.Rule{"start": {
			rule(&expr.Immediate{Register: r0, Data: ne32(7)},
				&expr.Payload{DestRegister: r1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				&expr.Lookup{SourceRegister: r0, SetName: "aff"},
				&expr.Dynset{SrcRegKey: r0, SetName: "aff", Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: time.Hour},
				&expr.Immediate{Register: r2, Data: []byte{10, 244, 2, 2}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat),
			rule(&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 3}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat),
			rule(&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 4}}, // not reached
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat),
		}},
		want: aps("10.244.1.3:8082", "10.244.2.2:8082"),
		pins: []pin{{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddrPort("10.244.2.2:8082")}},
	}, {
		name: "conditions",
		rules: map[string][]*gnft.Rule{"start": {
			// Another port: never taken.
			rule(&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{0, 81}},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: "wrong"}),
			// Depends on the source: some sources only.
			rule(&expr.Fib{Register: r0, FlagSADDR: true, ResultADDRTYPE: true},
				&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: ne32(2)},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: "local"}),
			rule(&expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc"}),
		}, "svc": {
			rule(&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 2}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat),
		}, "local": {
			rule(&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 3}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat),
		}, "wrong": {
			rule(&expr.Immediate{Register: r2, Data: []byte{10, 244, 9, 9}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat),
		}},
		want: aps("10.244.1.2:8080"),
		some: aps("10.244.1.3:8080"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			td := &tableData{addrLen: 4, family: unix.NFPROTO_IPV4, rules: tc.rules, sets: map[string]*gnft.Set{}, elems: tc.elems}
			for _, s := range tc.sets {
				td.sets[s.Name] = s
			}
			o := td.follow("start", web)
			if !slices.Equal(o.endpoints, tc.want) {
				t.Errorf("endpoints %v, want %v", o.endpoints, tc.want)
			}
			if !slices.Equal(o.pins, tc.pins) {
				t.Errorf("pins %v, want %v", o.pins, tc.pins)
			}
			if !slices.Equal(o.some, tc.some) {
				t.Errorf("for some sources %v, want %v", o.some, tc.some)
			}
		})
	}
}
