package ebpf

import (
	"cmp"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestCheckNorthSouth: the accepted values, and tc with SocketOnly.
func TestCheckNorthSouth(t *testing.T) {
	for _, c := range []struct {
		ns         NorthSouth
		socketOnly bool
		ok         bool
	}{
		{"", false, true}, {NorthSouthNFTables, false, true}, {NorthSouthTC, false, true},
		{"", true, true}, {NorthSouthTC, true, false}, {NorthSouthXDP, false, true}, {NorthSouthXDP, true, false},
		{"dpdk", false, false},
	} {
		cfg := Config{NorthSouth: c.ns, SocketOnly: c.socketOnly}
		if err := cfg.checkNorthSouth(); (err == nil) != c.ok {
			t.Errorf("NorthSouth %q SocketOnly %v: %v, want ok %v", c.ns, c.socketOnly, err, c.ok)
		}
	}
}

// TestCheckForwarding: the accepted NorthSouthForwarding values.
func TestCheckForwarding(t *testing.T) {
	for _, c := range []struct {
		fw Forwarding
		ok bool
	}{{"", true}, {ForwardingSNAT, true}, {ForwardingDSR, true}, {ForwardingHybrid, true}, {"DSR", false}, {"geneve", false}} {
		cfg := Config{NorthSouthForwarding: c.fw}
		if err := cfg.checkForwarding(); (err == nil) != c.ok {
			t.Errorf("NorthSouthForwarding %q: %v, want ok %v", c.fw, err, c.ok)
		}
	}
}

// TestTCDSRFlag: the external frontends of a service port carry the
// direct-server-return flag as its forwarding mode, else the
// configuration, says (hybrid: TCP only); cluster IP and Local frontends
// never do.
func TestTCDSRFlag(t *testing.T) {
	for _, c := range []struct {
		cfg   Forwarding
		mode  string
		proto model.Protocol
		local bool
		want  bool
	}{
		{"", "", model.TCP, false, false},
		{ForwardingSNAT, "", model.TCP, false, false},
		{ForwardingDSR, "", model.UDP, false, true},
		{ForwardingHybrid, "", model.TCP, false, true},
		{ForwardingHybrid, "", model.UDP, false, false},
		{"", "dsr", model.UDP, false, true},
		{ForwardingDSR, "snat", model.TCP, false, false},
		{ForwardingDSR, "bogus", model.TCP, false, true},
		{ForwardingDSR, "", model.TCP, true, false},
	} {
		tb := &tcBackend{plane: &tcPlane{cfg: Config{NorthSouthForwarding: c.cfg}}, family: model.IPv4, log: slog.New(slog.DiscardHandler),
			groups: map[groupName]*nsGroup{}, badMode: map[model.ServicePortName]bool{}}
		sp := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: "s"}, Protocol: c.proto}, Protocol: c.proto, Port: 80,
			ClusterIP: netip.MustParseAddr("10.96.0.1"), NodePort: 30080, ForwardingMode: c.mode}
		if c.local {
			sp.ExternalPolicy = model.PolicyLocal
		}
		st := newNSState()
		tg := &proxier.Targets{}
		tb.renderPort(st, sp.Name, sp, tg, tb.plan(sp, tg))
		for k, v := range st.fes {
			external := k.Addr != mapped16(sp.ClusterIP)
			if got := v.Flags&nsfeDSR != 0; got != (c.want && external) {
				t.Errorf("config %q, mode %q, %s, local %v: frontend %v has DSR %v, want %v", c.cfg, c.mode, c.proto, c.local, netip.AddrFrom16(k.Addr), got, c.want && external)
			}
		}
		if len(st.fes) != 2 {
			t.Errorf("%d frontends, want 2", len(st.fes))
		}
	}
}

// TestTCFrontends: cluster IP internal; node port, external IPs and
// load-balancer IPs external; load-balancer IPs with source ranges
// apart; SCTP the same, with its protocol number.
func TestTCFrontends(t *testing.T) {
	a := netip.MustParseAddr
	sp := &model.ServicePort{
		ClusterIP: a("10.96.0.1"), Port: 80, Protocol: model.TCP, NodePort: 30080,
		ExternalIPs:     []netip.Addr{a("203.0.113.1"), a("2001:db8::1")},
		LoadBalancerIPs: []netip.Addr{a("203.0.113.2")},
	}
	in, ext, ranged := tcFrontends(model.IPv4, sp)
	if len(in) != 1 || len(ext) != 3 || len(ranged) != 0 {
		t.Fatalf("got %d internal, %d external, %d ranged frontends, want 1, 3, 0", len(in), len(ext), len(ranged))
	}
	if ext[0].Addr != mapped16(netip.IPv4Unspecified()) || port16(ext[0].Port) != 30080 {
		t.Errorf("node port frontend %+v", ext[0])
	}
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	if _, ext, ranged = tcFrontends(model.IPv4, sp); len(ext) != 2 || len(ranged) != 1 {
		t.Errorf("with source ranges: %d external, %d ranged, want 2, 1", len(ext), len(ranged))
	}
	sp.Protocol = model.SCTP
	in, ext, ranged = tcFrontends(model.IPv4, sp)
	if len(in) != 1 || len(ext) != 2 || len(ranged) != 1 || in[0].Proto != 132 || ext[0].Proto != 132 || ranged[0].Proto != 132 {
		t.Errorf("SCTP: %d internal, %d external, %d ranged frontends (%+v %+v %+v), want 1, 2, 1 of protocol 132", len(in), len(ext), len(ranged), in, ext, ranged)
	}
}

// TestTCPlanShortCircuit: an externalTrafficPolicy Local port holds a
// short circuit (the cluster-wide endpoints, under keys with Pad
// nsfeKeyShort) for its load-balancer IPs with source ranges, and for
// every external frontend when it is SCTP, whose pods' packets reach
// tc untranslated; none with policy Cluster, nor for TCP frontends the
// socket programs translate.
func TestTCPlanShortCircuit(t *testing.T) {
	a := netip.MustParseAddr
	local := &model.Endpoint{Addr: netip.MustParseAddrPort("10.244.1.2:8080"), Local: true, Ready: true}
	remote := &model.Endpoint{Addr: netip.MustParseAddrPort("10.244.2.2:8080"), Ready: true}
	tg := &proxier.Targets{Internal: []*model.Endpoint{local, remote}, External: []*model.Endpoint{local}, HasEndpoints: true}
	sp := &model.ServicePort{
		ClusterIP: a("10.96.0.1"), Port: 80, Protocol: model.TCP, NodePort: 30080,
		LoadBalancerIPs: []netip.Addr{a("203.0.113.2")}, ExternalPolicy: model.PolicyLocal,
	}
	b := &tcBackend{family: model.IPv4}
	if p := b.plan(sp, tg); len(p.short) != 0 {
		t.Errorf("TCP without ranges: %d short-circuit keys, want 0", len(p.short))
	}
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	p := b.plan(sp, tg)
	if len(p.short) != 1 || p.short[0].Pad != nsfeKeyShort || p.short[0].Addr != mapped16(a("203.0.113.2")) {
		t.Fatalf("TCP with ranges: short-circuit keys %+v, want the load-balancer IP's", p.short)
	}
	if len(p.eps[roleShort]) != 2 {
		t.Errorf("short circuit endpoints %v, want both", p.eps[2])
	}
	sp.Protocol = model.SCTP
	if p := b.plan(sp, tg); len(p.short) != 2 {
		t.Errorf("SCTP: %d short-circuit keys, want 2 (node port, ranged load-balancer IP)", len(p.short))
	}
	sp.ExternalPolicy = model.PolicyCluster
	if p := b.plan(sp, tg); len(p.short) != 0 {
		t.Errorf("policy Cluster: %d short-circuit keys, want 0", len(p.short))
	}
}

// TestRangeKey: IPv4 prefixes are IPv4-mapped, their length counted
// after the id's 32 bits and the 96 bits of the mapping.
func TestRangeKey(t *testing.T) {
	k := rangeKey(7, netip.MustParsePrefix("198.51.100.9/24"))
	if k.Prefixlen != 32+96+24 || k.ID != 7 || k.Addr != mapped16(netip.MustParseAddr("198.51.100.0")) {
		t.Errorf("IPv4: %+v", k)
	}
	k = rangeKey(7|v6GroupBit, netip.MustParsePrefix("2001:db8::/32"))
	if k.Prefixlen != 32+32 || k.Addr != netip.MustParseAddr("2001:db8::").As16() {
		t.Errorf("IPv6: %+v", k)
	}
}

// TestTCMapsNameTheirConfigField: a full map of the tc plane names the
// Config field that sizes it (it said "(fixed size)" for all of them).
func TestTCMapsNameTheirConfigField(t *testing.T) {
	for name, want := range map[string]string{mapNSFe: "MaxServices", mapNSBe: "MaxBackends", mapNSCt: "MaxSockets", mapNSRev: "MaxSockets", mapNSAff: "MaxAffinity"} {
		if got := configField(name); got != want {
			t.Errorf("configField(%s) = %q, want %q", name, got, want)
		}
	}
}

// TestNSSlotRows: slots read from the kernel in any order make rows with
// gaps (and strays beyond the limit), whatever size the frontends'
// counts gave them, and diffSlots writes what a
// desired state adds or changes and deletes what it lacks.
func TestNSSlotRows(t *testing.T) {
	val := func(b byte) nsbeVal { return nsbeVal{Addr: [16]byte{15: b}, Port: [2]byte{0, b}} }
	have := newNSState()
	have.fes[nsfeKey{Port: [2]byte{0, 1}}] = nsfeVal{ID: 3, Count: 4}
	have.fes[nsfeKey{Port: [2]byte{0, 2}}] = nsfeVal{ID: 3, Count: 4}
	have.fes[nsfeKey{Port: [2]byte{0, 3}}] = nsfeVal{ID: 6, Count: 2}
	r := newSlotReader(have, 8)
	for _, e := range []struct {
		id, slot uint32
		v        byte
	}{{1, 2, 12}, {2, 2, 22}, {1, 0, 10}, {2, 1, 21}, {3, 0, 30}, {2, 0, 20}, {1, 0, 99}, {4, 8, 40}} {
		r.add(beKey{ID: e.id, Slot: e.slot}, val(e.v))
	}
	r.finish()
	if have.nslots != 6 {
		t.Errorf("nslots %d, want 6", have.nslots)
	}
	if got := slices.Sorted(maps.Keys(have.slots)); !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Errorf("rows %v, want [1 2 3]", got)
	}
	if got := slices.Sorted(maps.Keys(have.gaps)); !slices.Equal(got, []uint32{1}) {
		t.Errorf("rows with gaps %v, want [1]", got)
	}
	for _, c := range []struct {
		id, slot uint32
		ok       bool
		v        byte
	}{{1, 0, true, 10}, {1, 1, false, 0}, {1, 2, true, 12}, {1, 3, false, 0}, {2, 1, true, 21}, {3, 0, true, 30}, {3, 1, false, 0}, {4, 8, false, 0}, {6, 0, false, 0}, {9, 0, false, 0}} {
		if v, ok := have.slot(c.id, c.slot); ok != c.ok || ok && v != val(c.v) {
			t.Errorf("slot %d/%d: %v %v, want %v %v", c.id, c.slot, v, ok, val(c.v), c.ok)
		}
	}
	want := newNSStateSized(0, 3, 5)
	want.setRow(1, []nsbeVal{val(10), val(11), val(13)})
	want.setRow(2, []nsbeVal{val(20)})
	want.setRow(5, []nsbeVal{val(50)})
	want.setRow(6, nil)
	if want.nslots != 5 || len(want.slots) != 3 {
		t.Errorf("want holds %d slots in %d rows, want 5 in 3", want.nslots, len(want.slots))
	}
	putK, putV, del := diffSlots(have, want)
	put := map[beKey]nsbeVal{}
	for i, k := range putK {
		put[k] = putV[i]
	}
	if wantPut := map[beKey]nsbeVal{{1, 1}: val(11), {1, 2}: val(13), {5, 0}: val(50)}; !maps.Equal(put, wantPut) || len(putK) != len(wantPut) {
		t.Errorf("put %v, want %v", put, wantPut)
	}
	slices.SortFunc(del, func(a, b beKey) int { return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Slot, b.Slot)) })
	if wantDel := []beKey{{2, 1}, {2, 2}, {3, 0}, {4, 8}}; !slices.Equal(del, wantDel) {
		t.Errorf("delete %v, want %v", del, wantDel)
	}
	have.dropRow(1)
	have.dropRow(7)
	if _, ok := have.gaps[1]; have.nslots != 4 || ok {
		t.Errorf("after dropping row 1: %d slots, gaps kept %v; want 4, false", have.nslots, ok)
	}
}

// TestNSSlotsFromArena: into empty maps (a first sync), the slots of a
// rendered state are written from the arena its rows were cut from, with
// their keys in the arena's order; a state whose rows are not exactly
// the arena's is diffed row by row, with the same result.
func TestNSSlotsFromArena(t *testing.T) {
	val := func(b byte) nsbeVal { return nsbeVal{Addr: [16]byte{15: b}, Port: [2]byte{0, b}} }
	render := func(replace bool) *nsState {
		st := newNSStateSized(0, 3, 6)
		for _, g := range []struct {
			id   uint32
			vals []byte
		}{{7, []byte{70, 71, 72}}, {3, nil}, {5, []byte{50}}, {2, []byte{20, 21}}} {
			row := st.newRow(g.id, len(g.vals))
			for i, b := range g.vals {
				row[i] = val(b)
			}
			st.setRow(g.id, row)
		}
		if replace {
			st.setRow(5, []nsbeVal{val(50)}) // not the arena's row
		}
		return st
	}
	have := newNSState()
	have.stray = []beKey{{9, 1 << 30}}
	wantPut := map[beKey]nsbeVal{{7, 0}: val(70), {7, 1}: val(71), {7, 2}: val(72), {5, 0}: val(50), {2, 0}: val(20), {2, 1}: val(21)}
	for _, replace := range []bool{false, true} {
		want := render(replace)
		putK, putV, del := diffSlots(have, want)
		put := map[beKey]nsbeVal{}
		for i, k := range putK {
			put[k] = putV[i]
		}
		if !maps.Equal(put, wantPut) || len(putK) != len(wantPut) || len(putV) != len(putK) {
			t.Errorf("replace %v: put %v %v, want %v", replace, putK, putV, wantPut)
		}
		if !slices.Equal(del, have.stray) {
			t.Errorf("replace %v: delete %v, want %v", replace, del, have.stray)
		}
		fromArena := len(putV) > 0 && &putV[0] == &want.arena[0]
		if fromArena == replace {
			t.Errorf("replace %v: values from the arena %v, want %v", replace, fromArena, !replace)
		}
		if !replace && !slices.Equal(putK, []beKey{{7, 0}, {7, 1}, {7, 2}, {5, 0}, {2, 0}, {2, 1}}) {
			t.Errorf("keys %v, want them in arena order", putK)
		}
	}
	// Against maps that hold slots, the rows are diffed.
	have.setRow(2, []nsbeVal{val(20), val(21)})
	putK, _, _ := diffSlots(have, render(false))
	if len(putK) != 4 {
		t.Errorf("put %v, want the 4 slots of rows 7 and 5", putK)
	}
}
