package nftnl

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

func ne32(v uint32) []byte { return U32(v) }

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

// TestFollow checks, without root, that Follow finds where a service's
// packets go whatever the map layout: a group . index map, an interval
// map of random-number ranges, an interval map keyed by the packet's
// destination, a concatenated interval map with key ends, constant DNATs
// with session-affinity records, and conditions on what it cannot know.
func TestFollow(t *testing.T) {
	dnat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: r2, RegProtoMin: r3, Specified: true}
	web := Flow{Daddr: []byte{10, 96, 0, 10}, Proto: unix.IPPROTO_TCP, Dport: 80}
	destKey := func(last ...byte) []byte { return append([]byte{10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0}, last...) }
	byDest := map[string][]Rule{"start": {{
		&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r1},
		&expr.Payload{DestRegister: r2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Numgen{Register: r3, Modulus: 0xffff, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: r0, DestRegister: r2, IsDestRegSet: true, SetName: "eps"},
		dnat,
	}}}
	byDestSet := []*Set{{Name: "eps", Interval: true, Key: Concat(TypeIPAddr, TypeInetProto, TypeInetService, TypeMark),
		Data: Concat(TypeIPAddr, TypeInetService)}}
	for _, tc := range []struct {
		name  string
		sets  []*Set
		elems map[string][]Elem
		rules map[string][]Rule
		want  []netip.AddrPort
		pins  []Pin
		some  []netip.AddrPort
		aff   bool
	}{{
		name: "group . index",
		sets: []*Set{{Name: "eps", Key: Concat(TypeMark, TypeMark), Data: Concat(TypeIPAddr, TypeInetService)}},
		elems: map[string][]Elem{"eps": {
			{Key: append(ne32(10), ne32(0)...), Val: epVal("10.244.1.2:8080")},
			{Key: append(ne32(10), ne32(1)...), Val: epVal("10.244.2.2:8080")},
			{Key: append(ne32(11), ne32(0)...), Val: epVal("10.244.9.9:8080")}, // another group
		}},
		rules: map[string][]Rule{"start": {
			{&expr.Verdict{Kind: expr.VerdictJump, Chain: "mark"}},
			{&expr.Immediate{Register: r0, Data: ne32(10)},
				&expr.Numgen{Register: r1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: r0, DestRegister: r2, IsDestRegSet: true, SetName: "eps"},
				dnat},
		}, "mark": {
			{&expr.Meta{Key: expr.MetaKeyMARK, Register: r0}, &expr.Cmp{Op: expr.CmpOpNeq, Register: r0, Data: ne32(0)}},
		}},
		want: aps("10.244.1.2:8080", "10.244.2.2:8080"),
	}, {
		name: "ranges keyed by the destination",
		sets: byDestSet,
		elems: map[string][]Elem{"eps": { // as the kernel lists them: descending
			{Key: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0xff, 0xff, 0xff, 0xff}, IntervalEnd: true},
			{Key: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0}, Val: epVal("10.244.9.9:8080")},
			{Key: destKey(0xff, 0xff, 0xff, 0xff), IntervalEnd: true},
			{Key: destKey(0x80, 0, 0, 0), Val: epVal("10.244.2.2:8080")},
			{Key: destKey(0x7f, 0xff, 0xff, 0xff), IntervalEnd: true},
			{Key: destKey(0, 0, 0, 0), Val: epVal("10.244.1.2:8080")},
		}},
		rules: byDest,
		want:  aps("10.244.1.2:8080", "10.244.2.2:8080"),
	}, {
		name: "ranges with key ends",
		sets: byDestSet,
		elems: map[string][]Elem{"eps": {
			{Key: destKey(0x80, 0, 0, 0), KeyEnd: destKey(0xff, 0xff, 0xff, 0xff), Val: epVal("10.244.2.2:8080")},
			{Key: destKey(0, 0, 0, 0), KeyEnd: destKey(0x7f, 0xff, 0xff, 0xff), Val: epVal("10.244.1.2:8080")},
			{Key: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0},
				KeyEnd: []byte{10, 96, 0, 20, 6, 0, 0, 0, 0, 80, 0, 0, 0xff, 0xff, 0xff, 0xff}, Val: epVal("10.244.9.9:8080")},
		}},
		rules: byDest,
		want:  aps("10.244.1.2:8080", "10.244.2.2:8080"),
	}, {
		name: "affinity with constant endpoints",
		sets: []*Set{{Name: "aff", Timeout: true, Dynamic: true, Key: Concat(TypeMark, TypeIPAddr)}},
		elems: map[string][]Elem{"aff": {
			{Key: append(ne32(7), 10, 244, 1, 2)},
			{Key: append(ne32(8), 10, 244, 1, 3)}, // another endpoint's record
		}},
		rules: map[string][]Rule{"start": {
			{&expr.Immediate{Register: r0, Data: ne32(7)},
				&expr.Payload{DestRegister: r1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				&expr.Lookup{SourceRegister: r0, SetName: "aff"},
				&expr.Dynset{SrcRegKey: r0, SetName: "aff", Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: time.Hour},
				&expr.Immediate{Register: r2, Data: []byte{10, 244, 2, 2}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat},
			{&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 3}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat},
			{&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 4}}, // not reached
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x92}},
				dnat},
		}},
		want: aps("10.244.1.3:8082", "10.244.2.2:8082"),
		pins: []Pin{{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddrPort("10.244.2.2:8082")}},
		aff:  true,
	}, {
		name: "conditions",
		rules: map[string][]Rule{"start": {
			// Another port: never taken.
			{&expr.Payload{DestRegister: r0, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: []byte{0, 81}},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: "wrong"}},
			// Depends on the source: some sources only.
			{&expr.Fib{Register: r0, FlagSADDR: true, ResultADDRTYPE: true},
				&expr.Cmp{Op: expr.CmpOpEq, Register: r0, Data: ne32(2)},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: "local"}},
			{&expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc"}},
		}, "svc": {
			{&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 2}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat},
		}, "local": {
			{&expr.Immediate{Register: r2, Data: []byte{10, 244, 1, 3}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat},
		}, "wrong": {
			{&expr.Immediate{Register: r2, Data: []byte{10, 244, 9, 9}},
				&expr.Immediate{Register: r3, Data: []byte{0x1f, 0x90}},
				dnat},
		}},
		want: aps("10.244.1.2:8080"),
		some: aps("10.244.1.3:8080"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := &Table{Proto: unix.NFPROTO_IPV4, Name: "t", Sets: tc.sets, Elems: tc.elems}
			// The rules go through their encoding, as a dump returns
			// them.
			for name, rules := range tc.rules {
				c := Chain{Name: name}
				for _, r := range rules {
					enc, err := Encode(tbl.Proto, r)
					if err != nil {
						t.Fatal(err)
					}
					c.Rules = append(c.Rules, enc)
				}
				tbl.Chains = append(tbl.Chains, c)
			}
			o := tbl.Follow("start", web)
			if !cmp.Equal(o.Endpoints, tc.want, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })) {
				t.Errorf("endpoints %v, want %v", o.Endpoints, tc.want)
			}
			if fmt.Sprint(o.Pins) != fmt.Sprint(tc.pins) {
				t.Errorf("pins %v, want %v", o.Pins, tc.pins)
			}
			if fmt.Sprint(o.Some) != fmt.Sprint(tc.some) {
				t.Errorf("for some sources %v, want %v", o.Some, tc.some)
			}
			if o.Affinity != tc.aff {
				t.Errorf("affinity %v, want %v", o.Affinity, tc.aff)
			}
		})
	}
}

// TestFlowOf: a dispatch map's key gives the packet it stands for; other
// keys give none.
func TestFlowOf(t *testing.T) {
	for _, f := range []Family{FamilyOf(model.IPv4), FamilyOf(model.IPv6)} {
		tbl := &Table{Proto: f.Proto}
		a := netip.MustParseAddr("10.96.0.1")
		if f.AddrLen == 16 {
			a = netip.MustParseAddr("fd00::1")
		}
		got, ok := tbl.FlowOf(&Set{Key: Concat(f.AddrType, TypeInetProto, TypeInetService)}, f.Key(a, model.UDP, 53))
		if want := (Flow{Daddr: f.Addr(a), Proto: unix.IPPROTO_UDP, Dport: 53}); !ok || !cmp.Equal(got, want) {
			t.Errorf("%s: service key: %+v %v", f.Name(), got, ok)
		}
		got, ok = tbl.FlowOf(&Set{Key: Concat(TypeInetProto, TypeInetService)}, PortKey(model.TCP, 30080))
		if want := (Flow{Proto: unix.IPPROTO_TCP, Dport: 30080}); !ok || !cmp.Equal(got, want) {
			t.Errorf("%s: node port key: %+v %v", f.Name(), got, ok)
		}
		if _, ok := tbl.FlowOf(&Set{Key: f.AddrType}, f.Addr(a)); ok {
			t.Errorf("%s: an address set gives a flow", f.Name())
		}
	}
}

// TestDecodeExprsRoundTrip: every rule of the sample batch (each
// expression kind the backends use) decodes to expressions that encode
// to the same bytes, and its text is the recorder's.
func TestDecodeExprsRoundTrip(t *testing.T) {
	for _, f := range []Family{FamilyOf(model.IPv4), FamilyOf(model.IPv6)} {
		msgs, err := DecodeBatch(sampleBatch(t, f, "t").Bytes())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range msgs {
			if m.Type != unix.NFT_MSG_NEWRULE {
				continue
			}
			n++
			r, err := DecodeExprs(f.Proto, m.Exprs)
			if err != nil {
				t.Fatalf("%s: %v", f.Name(), err)
			}
			enc, err := Encode(f.Proto, r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, m.Exprs) {
				t.Errorf("%s: rule of %s does not round-trip:\n%s\n%s", f.Name(), m.Name, ExprText(m.Exprs), ExprText(enc))
			}
			if line := strings.TrimSuffix(Text([]Message{m}), "\n"); !strings.HasSuffix(line, " "+ExprText(m.Exprs)) {
				t.Errorf("%s: ExprText %q is not the end of %q", f.Name(), ExprText(m.Exprs), line)
			}
		}
		if n == 0 {
			t.Fatal("no rules in the sample batch")
		}
	}
}

// TestKernelReadTable commits the sample batch to the kernel and reads it
// back: chains in creation order with hooks and rules (as List prints
// them), sets with their elements, and Follow finds where the dispatch
// map sends packets.
func TestKernelReadTable(t *testing.T) {
	c := testConn(t)
	ctx := t.Context()
	for _, f := range []Family{FamilyOf(model.IPv4), FamilyOf(model.IPv6)} {
		if _, err := c.ReadTable(ctx, f.Proto, "t"); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s: a missing table: %v", f.Name(), err)
		}
		if err := c.Commit(ctx, sampleBatch(t, f, "t")); err != nil {
			t.Fatalf("%s: %+v", f.Name(), err)
		}
		tbl, err := c.ReadTable(ctx, f.Proto, "t")
		if err != nil {
			t.Fatal(err)
		}
		var chains []string
		for _, ch := range tbl.Chains {
			chains = append(chains, ch.Name)
		}
		if want := []string{"target", "pre", "post", "filter"}; !cmp.Equal(chains, want) {
			t.Errorf("%s: chains %v, want %v", f.Name(), chains, want)
		}
		if h := tbl.Chain("pre").Hook; h == nil || HookName(h.Num) != "prerouting" || h.Priority != -100 || tbl.Chain("target").Hook != nil {
			t.Errorf("%s: hooks %+v %+v", f.Name(), h, tbl.Chain("target").Hook)
		}
		list, err := c.List(ctx, f.Proto, "t")
		if err != nil {
			t.Fatal(err)
		}
		rules := 0
		for _, ch := range tbl.Chains {
			for _, r := range ch.Rules {
				rules++
				line := fmt.Sprintf("add rule %s t %s %s\n", f.Name(), ch.Name, ExprText(r))
				if !strings.Contains(list, line) {
					t.Errorf("%s: %q is not in the listing:\n%s", f.Name(), line, list)
				}
				if _, err := DecodeExprs(f.Proto, r); err != nil {
					t.Errorf("%s: %v", f.Name(), err)
				}
			}
		}
		if rules != 9 {
			t.Errorf("%s: %d rules, want 9", f.Name(), rules)
		}
		svc := tbl.Set("svc")
		if svc == nil || len(tbl.Sets) != 4 || len(tbl.Elems["svc"]) != 2 || len(tbl.Elems["eps"]) != 2 {
			t.Fatalf("%s: sets %+v, elements %+v", f.Name(), tbl.Sets, tbl.Elems)
		}
		ep := "10.0.1.2:8080"
		if f.AddrLen == 16 {
			ep = "[fd00:1::2]:8080"
		}
		for _, el := range tbl.Elems["svc"] {
			fl, ok := tbl.FlowOf(svc, el.Key)
			if !ok || el.Verdict == nil {
				t.Fatalf("%s: element %+v", f.Name(), el)
			}
			var o Outcome
			var want Outcome
			switch el.Verdict.String() {
			case "drop":
				o = Outcome{Verdicts: []string{"drop"}} // a verdict, not a chain
				want = o
			case "goto target":
				o = tbl.Follow(el.Verdict.Chain, fl)
				want = Outcome{Endpoints: aps(ep), Affinity: true}
			default:
				t.Fatalf("%s: verdict %v", f.Name(), el.Verdict)
			}
			if fmt.Sprint(o) != fmt.Sprint(want) {
				t.Errorf("%s: %s: %+v, want %+v", f.Name(), ValueText(el.Key, svc.Key), o, want)
			}
		}
	}
}
