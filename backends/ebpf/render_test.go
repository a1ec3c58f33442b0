package ebpf

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

func TestLayout(t *testing.T) {
	for _, c := range []struct {
		name       string
		prev, want []netip.AddrPort
		out        []netip.AddrPort
	}{
		{"new", nil, aps("10.0.0.1:80", "10.0.0.2:80"), aps("10.0.0.1:80", "10.0.0.2:80")},
		{"unchanged", aps("10.0.0.2:80", "10.0.0.1:80"), aps("10.0.0.1:80", "10.0.0.2:80"), aps("10.0.0.2:80", "10.0.0.1:80")},
		{"append", aps("10.0.0.1:80"), aps("10.0.0.1:80", "10.0.0.2:80"), aps("10.0.0.1:80", "10.0.0.2:80")},
		{"remove first: last moves in", aps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"), aps("10.0.0.2:80", "10.0.0.3:80"), aps("10.0.0.3:80", "10.0.0.2:80")},
		{"remove last", aps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"), aps("10.0.0.1:80", "10.0.0.2:80"), aps("10.0.0.1:80", "10.0.0.2:80")},
		{"remove first and last", aps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"), aps("10.0.0.2:80", "10.0.0.3:80"), aps("10.0.0.3:80", "10.0.0.2:80")},
		{"replace", aps("10.0.0.1:80", "10.0.0.2:80"), aps("10.0.0.2:80", "10.0.0.9:80"), aps("10.0.0.2:80", "10.0.0.9:80")},
		{"all gone", aps("10.0.0.1:80"), nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := layout(c.prev, c.want); !slices.Equal(got, c.out) {
				t.Errorf("layout(%v, %v) = %v, want %v", c.prev, c.want, got, c.out)
			}
		})
	}
}

func TestRender(t *testing.T) {
	e := func(s string, local bool) *model.Endpoint {
		return &model.Endpoint{Addr: netip.MustParseAddrPort(s), Ready: true, Serving: true, Local: local}
	}
	cluster := []*model.Endpoint{e("10.244.1.2:8080", true), e("10.244.2.2:8080", false)}
	local := cluster[:1]
	sp := &model.ServicePort{
		Name:            backendtest.PortName("web", "", model.TCP),
		ClusterIP:       netip.MustParseAddr("10.96.0.1"),
		Port:            80,
		Protocol:        model.TCP,
		NodePort:        30080,
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("203.0.113.1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.2")},
		SessionAffinity: true,
		AffinityTimeout: 1500 * time.Millisecond,
		InternalPolicy:  model.PolicyLocal,
	}
	ids := &idAllocator{}
	s, err := render(model.IPv4, sp, &proxier.Targets{Internal: local, External: cluster, HasEndpoints: true}, nil, ids)
	if err != nil {
		t.Fatal(err)
	}
	if s.groups[0] == nil || s.groups[1] == nil || s.groups[0].id == s.groups[1].id {
		t.Fatalf("want two groups (internal local, external cluster), got %+v", s.groups)
	}
	want := map[feKey]svcVal{
		{netip.MustParseAddr("10.96.0.1"), 80, 6}:   {ID: s.groups[0].id, Count: 1, AffinitySec: 2},
		{netip.IPv4Unspecified(), 30080, 6}:         {ID: s.groups[1].id, Count: 2, AffinitySec: 2},
		{netip.MustParseAddr("203.0.113.1"), 80, 6}: {ID: s.groups[1].id, Count: 2, AffinitySec: 2},
		{netip.MustParseAddr("203.0.113.2"), 80, 6}: {ID: s.groups[1].id, Count: 2, AffinitySec: 2},
	}
	if len(s.fes) != len(want) {
		t.Errorf("frontends %v, want %v", s.fes, want)
	}
	for k, v := range want {
		if got, _ := s.fe(k); got != v {
			t.Errorf("frontend %s = %+v, want %+v", k, got, v)
		}
	}

	// Source ranges keep the load-balancer IP out; no local endpoint
	// with endpoints elsewhere is a drop; ids and slots are kept.
	sp2 := *sp
	sp2.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	s2, err := render(model.IPv4, &sp2, &proxier.Targets{Internal: nil, External: cluster, HasEndpoints: true}, s, ids)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.fe(feKey{netip.MustParseAddr("203.0.113.2"), 80, 6}); ok {
		t.Error("load-balancer IP with source ranges has a frontend")
	}
	if v, _ := s2.fe(feKey{netip.MustParseAddr("10.96.0.1"), 80, 6}); v.Flags != svcDrop || v.Count != 0 || v.ID != s.groups[0].id {
		t.Errorf("cluster IP without local endpoints: %+v, want a drop in group %d", v, s.groups[0].id)
	}
	if s2.groups[1].id != s.groups[1].id || !slices.Equal(s2.groups[1].eps, s.groups[1].eps) {
		t.Errorf("external group changed: %+v -> %+v", s.groups[1], s2.groups[1])
	}

	// No endpoints at all: a reject (count 0, no flag). SCTP: nothing.
	s3, _ := render(model.IPv4, &model.ServicePort{Name: sp.Name, ClusterIP: sp.ClusterIP, Port: 80, Protocol: model.TCP}, &proxier.Targets{}, nil, ids)
	if v, _ := s3.fe(feKey{sp.ClusterIP, 80, 6}); v.Count != 0 || v.Flags != 0 {
		t.Errorf("no endpoints: %+v, want count 0 without flags", v)
	}
	s4, _ := render(model.IPv4, &model.ServicePort{Name: sp.Name, ClusterIP: sp.ClusterIP, Port: 80, Protocol: model.SCTP}, &proxier.Targets{Internal: cluster, HasEndpoints: true}, nil, ids)
	if len(s4.fes) != 0 {
		t.Errorf("SCTP frontends %v, want none", s4.fes)
	}
	// External policy Local: local sockets use the cluster endpoints.
	sp5 := *sp
	sp5.InternalPolicy, sp5.ExternalPolicy = "", model.PolicyLocal
	s5, _ := render(model.IPv4, &sp5, &proxier.Targets{Internal: cluster, External: local, HasEndpoints: true}, nil, ids)
	if s5.groups[1] != nil || len(s5.groups[0].eps) != 2 {
		t.Errorf("external policy Local: groups %+v, want one group of both endpoints", s5.groups)
	}
}

func TestRecoverState(t *testing.T) {
	sp := &model.ServicePort{Name: backendtest.PortName("web", "", model.TCP), ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: model.TCP, NodePort: 30080}
	have := map[feKey]svcVal{
		{sp.ClusterIP, 80, 6}:               {ID: 7, Count: 2},
		{netip.IPv4Unspecified(), 30080, 6}: {ID: 7, Count: 2},
	}
	groups := map[uint32][]netip.AddrPort{7: aps("10.244.1.2:8080", "10.244.2.2:8080", "10.244.9.9:8080")}
	s := recoverState(model.IPv4, sp, have, groups, map[uint32]bool{}, false)
	if s == nil || s.groups[0] == nil || s.groups[0].id != 7 || len(s.groups[0].eps) != 2 || s.groups[1] != nil {
		t.Fatalf("recovered %+v, want group 7 with 2 slots", s)
	}
	if s := recoverState(model.IPv4, sp, have, groups, map[uint32]bool{7: true}, false); s != nil {
		t.Errorf("recovered a claimed group: %+v", s)
	}
	be := map[beKey]netip.AddrPort{{7, 0}: groups[7][0], {7, 1}: groups[7][1], {7, 3}: groups[7][2]}
	if g := groupsOf(be)[7]; len(g) != 2 {
		t.Errorf("groupsOf stops at the first gap: %v", g)
	}
}

// TestMapLayout checks that the Go types match the map definitions of
// the compiled objects.
func TestMapLayout(t *testing.T) {
	sock, err := loadSock()
	if err != nil {
		t.Fatal(err)
	}
	destroy, err := loadDestroy()
	if err != nil {
		t.Fatal(err)
	}
	specs := map[string]*ebpf.MapSpec{}
	for n, m := range sock.Maps {
		specs[n] = m
	}
	for n, m := range destroy.Maps {
		specs[n] = m
	}
	for _, c := range []struct {
		name       string
		key, value any
	}{
		{mapSvc4, svc4Key{}, svcVal{}},
		{mapSvc6, svc6Key{}, svcVal{}},
		{mapBe4, beKey{}, be4Val{}},
		{mapBe6, beKey{}, be6Val{}},
		{mapRev, revKey{}, revVal{}},
		{mapNetNS, uint64(0), uint8(0)},
		{mapNode4, [4]byte{}, uint8(0)},
		{mapNode6, svc6Key{}, uint8(0)},
		{mapStale, staleKey{}, uint8(0)},
		{mapAff4, affKey{}, affVal{}},
		{mapAff6, affKey{}, affVal{}},
		{mapMag4, uint32(0), [DefaultMaglevTableSize]uint32{}},
		{mapMag6, uint32(0), [DefaultMaglevTableSize]uint32{}},
	} {
		ms := specs[c.name]
		if ms == nil {
			t.Errorf("no map %s in the objects", c.name)
			continue
		}
		if k, v := binary.Size(c.key), binary.Size(c.value); uint32(k) != ms.KeySize || uint32(v) != ms.ValueSize {
			t.Errorf("%s: Go key/value sizes %d/%d, objects %d/%d", c.name, k, v, ms.KeySize, ms.ValueSize)
		}
	}
	for _, name := range pinnedMaps() {
		if specs[name].Pinning != ebpf.PinByName {
			t.Errorf("%s is not pinned by name", name)
		}
	}
}

// TestRenderNodeOnlyRanges: with north-south at tc (a nodeRanges
// decision), a load-balancer IP with source ranges gets a frontend
// flagged node-only: the external group when the node is admitted,
// else a drop; without one (nftables north-south), no frontend. A
// restart recovers the group from an admitted node-only frontend, not
// from a drop.
func TestRenderNodeOnlyRanges(t *testing.T) {
	eps := []*model.Endpoint{
		{Addr: netip.MustParseAddrPort("10.244.1.2:8080"), Ready: true, Serving: true, Local: true},
		{Addr: netip.MustParseAddrPort("10.244.2.2:8080"), Ready: true, Serving: true},
	}
	lb, open := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	sp := &model.ServicePort{
		Name:                     backendtest.PortName("lb", "", model.TCP),
		ClusterIP:                netip.MustParseAddr("10.96.0.1"),
		Port:                     80,
		Protocol:                 model.TCP,
		LoadBalancerIPs:          []netip.Addr{lb, open},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
	}
	tg := &proxier.Targets{Internal: eps, External: eps, HasEndpoints: true}
	key := func(a netip.Addr) feKey { return feKey{a, 80, 6} }
	var ids idAllocator
	s, err := render(model.IPv4, sp, tg, nil, &ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.fes) != 1 {
		t.Fatalf("without a decision: frontends %+v, want the cluster IP alone", s.fes)
	}
	asked := map[netip.Addr]int{}
	node := func(_ *model.ServicePort, a netip.Addr) bool { asked[a]++; return a == open }
	s, err = renderRanged(model.IPv4, sp, tg, nil, &ids, node)
	if err != nil {
		t.Fatal(err)
	}
	g := s.groups[0]
	if v, ok := s.fe(key(open)); !ok || v != (svcVal{ID: g.id, Count: 2, Flags: svcNodeOnly}) {
		t.Errorf("admitted %v: %+v (found %t), want group %d of 2 slots, node-only", open, v, ok, g.id)
	}
	if v, ok := s.fe(key(lb)); !ok || v != (svcVal{ID: g.id, Flags: svcDrop | svcNodeOnly}) {
		t.Errorf("outside the ranges %v: %+v (found %t), want a node-only drop", lb, v, ok)
	}
	if v, _ := s.fe(key(sp.ClusterIP)); v.Flags != 0 {
		t.Errorf("cluster IP flagged %#x", v.Flags)
	}
	if asked[lb] != 1 || asked[open] != 1 {
		t.Errorf("decisions asked %v, want each IP once", asked)
	}
	// A Service without ranges: its load-balancer IPs are plain.
	plain := *sp
	plain.LoadBalancerSourceRanges = nil
	s, _ = renderRanged(model.IPv4, &plain, tg, nil, &ids, node)
	if v, ok := s.fe(key(lb)); !ok || v.Flags != 0 || v.Count != 2 {
		t.Errorf("no ranges: %+v (found %t), want a plain frontend", v, ok)
	}
	// Recovery after a restart: only the drop is left, so nothing is
	// recovered from it; the admitted one gives its group.
	groups := map[uint32][]netip.AddrPort{7: aps("10.244.1.2:8080", "10.244.2.2:8080")}
	internalOnly := *sp
	internalOnly.ClusterIP = netip.Addr{}
	have := map[feKey]svcVal{key(lb): {ID: 7, Flags: svcDrop | svcNodeOnly}}
	if r := recoverState(model.IPv4, &internalOnly, have, groups, map[uint32]bool{}, true); r != nil {
		t.Errorf("recovered %+v from a node-only drop", r)
	}
	have[key(open)] = svcVal{ID: 7, Count: 2, Flags: svcNodeOnly}
	if r := recoverState(model.IPv4, &internalOnly, have, groups, map[uint32]bool{}, true); r == nil || r.groups[1] == nil || r.groups[1].id != 7 || len(r.groups[1].eps) != 2 {
		t.Errorf("recovered %+v, want group 7 of 2 slots", r)
	}
}
