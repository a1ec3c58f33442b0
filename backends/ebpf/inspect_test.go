package ebpf

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func TestRowStampResolve(t *testing.T) {
	slots := aps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
	var r rowStamp
	if got := r.resolve([]uint32{2, 2, 1, 2}, slots); !slices.Equal(got, []uint32{1, 2}) {
		t.Errorf("resolve = %v, want [1 2]", got)
	}
	// A slot the group lacks falls back to slot 0; a later row starts
	// afresh.
	if got := r.resolve([]uint32{7, 1}, slots); !slices.Equal(got, []uint32{0, 1}) {
		t.Errorf("resolve = %v, want [0 1]", got)
	}
	holed := []netip.AddrPort{{}, slots[1]}
	if got := r.resolve([]uint32{0, 5, 1}, holed); !slices.Equal(got, []uint32{1}) {
		t.Errorf("resolve without slot 0 = %v, want [1]", got)
	}
}

func TestSocketTablesFrontends(t *testing.T) {
	cip := netip.MustParseAddr("10.96.0.1")
	eps := aps("10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080")
	tb := &socketTables{
		family: model.IPv4,
		svc: map[feKey]svcVal{
			{cip, 80, 6}:                        {ID: 1, Count: 2},
			{cip, 53, 17}:                       {ID: 2, Count: 3, AffinitySec: 60, Flags: svcMaglev},
			{netip.IPv4Unspecified(), 30080, 6}: {ID: 1, Count: 2},
			{cip, 81, 6}:                        {ID: 3},
			{cip, 82, 6}:                        {ID: 4, Flags: svcDrop},
			{cip, 83, 6}:                        {ID: 5, Count: 3},
			{cip, 84, 132}:                      {ID: 1, Count: 2}, // SCTP: never matched
		},
		slots: map[uint32][]netip.AddrPort{
			1: eps[:2],
			2: eps,
			5: {eps[0], {}, eps[2]},
		},
		rows:   map[uint32][]uint32{2: {0, 2}},
		rowLen: 1021,
		nodes:  2,
	}
	want := map[string]proxier.Frontend{
		"10.96.0.1 tcp/80":     {Endpoints: eps[:2]},
		"10.96.0.1 udp/53":     {Endpoints: []netip.AddrPort{eps[0], eps[2]}, Affinity: true},
		"node-ports tcp/30080": {Endpoints: eps[:2]},
		"10.96.0.1 tcp/81":     {Verdict: "reject"},
		"10.96.0.1 tcp/82":     {Verdict: "drop"},
		"10.96.0.1 tcp/83":     {Endpoints: []netip.AddrPort{eps[0], eps[2]}},
	}
	got := byKey(t, tb.frontends())
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s not read", k)
			continue
		}
		w.Protocol = g.Protocol
		if d := w.Diff(g); d != "" {
			t.Errorf("%s: %s (%s)", k, d, g.Detail)
		}
	}
	if len(got) != 6 {
		t.Errorf("read %d frontends, want 6 (SCTP left out): %v", len(got), slices.Collect(maps.Keys(got)))
	}
	if d := got["10.96.0.1 udp/53"].Detail; !strings.Contains(d, "maglev table of 1021 entries") || !strings.Contains(d, "affinity 60s") {
		t.Errorf("maglev detail %q", d)
	}
	if d := got["10.96.0.1 tcp/83"].Detail; !strings.Contains(d, "1 slots missing") {
		t.Errorf("missing slot detail %q", d)
	}
	// Without a node address node ports match nothing.
	tb.nodes = 0
	if _, ok := byKey(t, tb.frontends())["node-ports tcp/30080"]; ok {
		t.Error("a node port was read with no node address")
	}
}

// byKey indexes fs by Key, failing on a repeated key.
func byKey(t *testing.T, fs []proxier.Frontend) map[string]proxier.Frontend {
	t.Helper()
	out := map[string]proxier.Frontend{}
	for _, f := range fs {
		if _, dup := out[f.Key()]; dup {
			t.Errorf("frontend %s read twice", f.Key())
		}
		out[f.Key()] = f
	}
	return out
}

func TestMergeParts(t *testing.T) {
	a, b, c := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80"), netip.MustParseAddrPort("10.0.0.3:80")
	fe := func(port uint16, f proxier.Frontend) proxier.Frontend {
		f.Addr, f.Protocol, f.Port = netip.MustParseAddr("192.0.2.1"), model.TCP, port
		return f
	}
	socket := []proxier.Frontend{
		fe(1, proxier.Frontend{Endpoints: []netip.AddrPort{a, b}, Affinity: true}),
		fe(2, proxier.Frontend{Endpoints: []netip.AddrPort{a, b}}),
		fe(3, proxier.Frontend{Verdict: "drop"}),
		fe(4, proxier.Frontend{Endpoints: []netip.AddrPort{a}}),
		fe(6, proxier.Frontend{Verdict: "reject", Affinity: true}),
		fe(7, proxier.Frontend{Endpoints: []netip.AddrPort{a}, Affinity: true}),
	}
	packet := []proxier.Frontend{
		// Local: the nftables part sends outside sources to the local
		// endpoint a, pods and the node to a and b.
		fe(1, proxier.Frontend{Endpoints: []netip.AddrPort{a}, SomeSources: []netip.AddrPort{b}, Affinity: true}),
		fe(2, proxier.Frontend{SomeSources: []netip.AddrPort{a, b}, Verdict: "drop"}),
		fe(3, proxier.Frontend{Verdict: "reject"}),
		fe(5, proxier.Frontend{Endpoints: []netip.AddrPort{c}}),
		fe(6, proxier.Frontend{Verdict: "reject", Affinity: true}),
		fe(7, proxier.Frontend{Endpoints: []netip.AddrPort{a}}),
	}
	want := map[uint16]proxier.Frontend{
		1: {Endpoints: []netip.AddrPort{a}, SomeSources: []netip.AddrPort{b}, Affinity: true},
		2: {SomeSources: []netip.AddrPort{a, b}, Verdict: "drop"},
		3: {Verdict: "reject (node and pod sockets: drop)"},
		4: {SomeSources: []netip.AddrPort{a}}, // no rule for other sources
		5: {Endpoints: []netip.AddrPort{c}},   // not translated: nftables serves all
		6: {Verdict: "reject", Affinity: true},
		7: {Endpoints: []netip.AddrPort{a}}, // packets do not stick
	}
	got := mergeParts(socket, packet, true)
	if len(got) != len(want) {
		t.Fatalf("merged %d frontends, want %d", len(got), len(want))
	}
	for _, g := range got {
		w := want[g.Port]
		if d := w.Diff(g); d != "" {
			t.Errorf("port %d: %s (%s)", g.Port, d, g.Detail)
		}
		if g.Port == 4 && !strings.Contains(g.Detail, "no rule") {
			t.Errorf("port 4 detail %q", g.Detail)
		}
	}
	// SocketOnly: the maps are all there is.
	for _, g := range mergeParts(socket, nil, false) {
		i := slices.IndexFunc(socket, func(s proxier.Frontend) bool { return s.Port == g.Port })
		if d := socket[i].Diff(g); d != "" || !strings.HasPrefix(g.Detail, "sockets: ") {
			t.Errorf("socket only, port %d: %s (%s)", g.Port, d, g.Detail)
		}
	}
}

// TestMergeNodeOnly: a load-balancer IP with source ranges, north-south
// at tc: the maps' node-only frontend (non-nil SourceRanges) that drops
// the node reads as tc's frontend with its ranges; one that admits the
// node merges as usual and keeps tc's ranges; a plain socket frontend
// beside ranges loses them (the fault shows).
func TestMergeNodeOnly(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("10.0.0.2:80")
	ranges := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	fe := func(port uint16, f proxier.Frontend) proxier.Frontend {
		f.Addr, f.Protocol, f.Port = netip.MustParseAddr("192.0.2.1"), model.TCP, port
		return f
	}
	socket := []proxier.Frontend{
		fe(1, proxier.Frontend{Verdict: "drop", SourceRanges: []netip.Prefix{}}),
		fe(2, proxier.Frontend{Endpoints: []netip.AddrPort{a, b}, SourceRanges: []netip.Prefix{}}),
		fe(3, proxier.Frontend{Endpoints: []netip.AddrPort{a, b}}),
	}
	var packet []proxier.Frontend
	for port := range uint16(3) {
		packet = append(packet, fe(port+1, proxier.Frontend{Endpoints: []netip.AddrPort{a, b}, SourceRanges: ranges}))
	}
	want := proxier.Frontend{Endpoints: []netip.AddrPort{a, b}, SourceRanges: ranges}
	for _, g := range mergeParts(socket, packet, true) {
		d := want.Diff(g)
		if g.Port == 3 {
			if d == "" || !strings.Contains(g.Detail, "apply to packets only") {
				t.Errorf("port 3: a plain socket frontend reads as ranged (%s)", g.Detail)
			}
			continue
		}
		if d != "" {
			t.Errorf("port %d: %s (%s)", g.Port, d, g.Detail)
		}
	}
}

// inspectCase is a service port of TestInspectAgreesWithWant.
type inspectCase struct {
	name string
	sp   *model.ServicePort
	eps  []*model.Endpoint
	// socketOnlyDiffs are the kinds whose read-back differs from
	// WantFrontends without the nftables part.
	socketOnlyDiffs []proxier.FrontendKind
}

// inspectCases returns service ports of every kind and policy, of
// family f, with a local endpoint (on node1) and a remote one.
func inspectCases(f model.IPFamily) []inspectCase {
	addr := func(x byte) netip.Addr {
		if f == model.IPv6 {
			return netip.AddrFrom16([16]byte{0: 0x20, 1: 0x01, 2: 0x0d, 3: 0xb8, 4: 0x51, 15: x})
		}
		return netip.AddrFrom4([4]byte{198, 51, 100, x})
	}
	ep := func(x byte, node string) *model.Endpoint {
		return &model.Endpoint{Addr: netip.AddrPortFrom(addr(100+x), 8080), Ready: true, Serving: true, NodeName: node, Local: node == "node1"}
	}
	local, remote := ep(1, "node1"), ep(2, "node2")
	base := func(n byte, proto model.Protocol, mod func(sp *model.ServicePort)) *model.ServicePort {
		sp := &model.ServicePort{
			Name:      backendtest.PortName(fmt.Sprintf("s%d", n), "", proto),
			ClusterIP: vip(f, n), Port: 80, Protocol: proto,
			NodePort:        30000 + uint16(n),
			ExternalIPs:     []netip.Addr{addr(n)},
			LoadBalancerIPs: []netip.Addr{addr(50 + n)},
		}
		if mod != nil {
			mod(sp)
		}
		return sp
	}
	both := []*model.Endpoint{local, remote}
	localPolicy := func(sp *model.ServicePort) { sp.ExternalPolicy = model.PolicyLocal }
	external := []proxier.FrontendKind{proxier.KindNodePort, proxier.KindExternalIP, proxier.KindLoadBalancer}
	return []inspectCase{
		{name: "cluster", sp: base(1, model.TCP, nil), eps: both},
		{name: "udp affinity", sp: base(2, model.UDP, func(sp *model.ServicePort) { sp.SessionAffinity, sp.AffinityTimeout = true, time.Minute }), eps: both},
		{name: "no endpoints", sp: base(3, model.TCP, nil)},
		{name: "external local", sp: base(4, model.TCP, localPolicy), eps: both, socketOnlyDiffs: external},
		{name: "external local, none local", sp: base(5, model.TCP, localPolicy), eps: []*model.Endpoint{remote}, socketOnlyDiffs: external},
		{name: "both local, none local", sp: base(6, model.TCP, func(sp *model.ServicePort) {
			sp.ExternalPolicy, sp.InternalPolicy = model.PolicyLocal, model.PolicyLocal
		}), eps: []*model.Endpoint{remote}, socketOnlyDiffs: external},
		{name: "internal local", sp: base(7, model.UDP, func(sp *model.ServicePort) { sp.InternalPolicy = model.PolicyLocal }), eps: both},
		{name: "source ranges", sp: base(8, model.TCP, func(sp *model.ServicePort) {
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(addr(0), addr(0).BitLen()-8)}
		}), eps: both, socketOnlyDiffs: []proxier.FrontendKind{proxier.KindLoadBalancer}},
		{name: "sctp", sp: base(9, model.SCTP, nil), eps: both, socketOnlyDiffs: []proxier.FrontendKind{
			proxier.KindClusterIP, proxier.KindNodePort, proxier.KindExternalIP, proxier.KindLoadBalancer}},
	}
}

// TestInspectAgreesWithWant renders service ports of every kind and
// policy as a sync does, decodes the maps it would write, and merges them
// with a perfect nftables part (WantFrontends itself): the read-back must
// be what WantFrontends asks for. Without the nftables part (SocketOnly)
// it differs exactly where the socket programs serve the node and its
// pods only: externalTrafficPolicy Local (they reach the cluster's
// endpoints), and what the programs leave to nftables (source ranges,
// SCTP).
func TestInspectAgreesWithWant(t *testing.T) {
	for _, f := range fams() {
		for _, sel := range []proxier.Scheduler{proxier.SchedulerRandom, proxier.SchedulerMaglev} {
			t.Run(f.String()+"/"+string(sel), func(t *testing.T) {
				cases := inspectCases(f)
				b := &backend{cfg: Config{MaglevTableSize: 1021}}
				st := newState()
				var ids idAllocator
				want := map[model.ServicePortName][]proxier.Frontend{}
				kinds := map[model.ServicePortName][]proxier.FrontendKind{}
				var packet []proxier.Frontend
				for _, c := range cases {
					tg := proxier.SelectTargets(c.sp, c.eps, proxier.Topology{NodeName: "node1"})
					s, err := render(f, c.sp, tg, nil, &ids)
					if err != nil {
						t.Fatal(err)
					}
					b.planTables(s, nil, sel)
					if err := st.admit(c.sp.Name, s, &Config{MaxServices: 100, MaxBackends: 100, MaxMaglevTables: 100}, f); err != nil {
						t.Fatal(err)
					}
					kinds[c.sp.Name], want[c.sp.Name] = proxier.WantFrontends(c.sp, tg, proxier.WantOptions{})
					packet = append(packet, want[c.sp.Name]...)
				}
				tb := tablesOf(f, st, 1021)
				for _, composed := range []bool{true, false} {
					var pk []proxier.Frontend
					if composed {
						pk = packet
					}
					got := byKey(t, mergeParts(tb.frontends(), pk, composed))
					n := 0
					for _, c := range cases {
						for i, w := range want[c.sp.Name] {
							g, ok := got[w.Key()]
							d := "not read"
							if ok {
								n++
								d = w.Diff(g)
							}
							wantDiff := !composed && slices.Contains(c.socketOnlyDiffs, kinds[c.sp.Name][i])
							if (d != "") != wantDiff {
								t.Errorf("composed %t, %s %s %s: diff %q, want a diff: %t (%s)", composed, c.name, kinds[c.sp.Name][i], w.Key(), d, wantDiff, g.Detail)
							}
						}
					}
					if n != len(got) {
						t.Errorf("composed %t: %d frontends read, %d claimed", composed, len(got), n)
					}
				}
			})
		}
	}
}

// tablesOf returns what the maps hold after a sync to st: frontends,
// slots and Maglev tables of m entries, and one node address.
func tablesOf(f model.IPFamily, st *state, m int) *socketTables {
	tb := &socketTables{family: f, svc: map[feKey]svcVal{}, slots: map[uint32][]netip.AddrPort{}, rows: map[uint32][]uint32{}, rowLen: m, nodes: 1}
	var r rowStamp
	for _, s := range st.svcs {
		for _, e := range s.fes {
			tb.svc[e.key] = e.val
		}
		for _, g := range s.groups {
			if g == nil {
				continue
			}
			tb.slots[g.id] = slices.Clone(g.eps)
			if g.maglev {
				tb.rows[g.id] = r.resolve(maglevTable(g.eps, m, nil), g.eps)
			}
		}
	}
	return tb
}

// TestInspectKernel syncs service ports of every kind into a backend,
// composed with nftables and SocketOnly, and reads them back: from the
// backend, and without it through the pinned link and through the
// cgroup. Before the programs are attached the maps serve nobody.
func TestInspectKernel(t *testing.T) {
	testnet.RequireRoot(t)
	for _, f := range fams() {
		for _, socketOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/socketOnly=%t", f, socketOnly), func(t *testing.T) {
				inspectKernel(t, f, socketOnly)
			})
		}
	}
}

func inspectKernel(t *testing.T, f model.IPFamily, socketOnly bool) {
	tn := testnet.New(t, testnet.Options{})
	cfg := Config{
		Config:      proxier.Config{NetNS: tn.Node1.Path(), NodeName: "node1", Families: []model.IPFamily{f}, Logger: testLogger(t)},
		CgroupPath:  emptyCgroup(t),
		PinPath:     bpffs(t),
		SocketOnly:  socketOnly,
		Scheduler:   proxier.SchedulerMaglev,
		MaxServices: 1024, MaxBackends: 1024, MaxAffinity: 64, MaxSockets: 64, MaxMaglevTables: 64,
	}
	be, err := NewBackend(cfg, f)
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*backend)
	cur := &b // the backend to clean up at the end
	t.Cleanup(func() {
		if err := (*cur).Cleanup(context.Background()); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		(*cur).Close()
	})
	cases := inspectCases(f)
	var svcs []testSvc
	for _, c := range cases {
		svcs = append(svcs, testSvc{Port: c.sp, Targets: proxier.SelectTargets(c.sp, c.eps, proxier.Topology{NodeName: "node1"})})
	}
	req := request(f, svcs, nil)
	// Before the first sync's end nothing is attached: only the
	// nftables part, which the sync below has not written yet.
	fs, err := b.Inspect(t.Context())
	if err != nil || len(fs) != 0 {
		t.Fatalf("before the first sync: %v, %v", fs, err)
	}
	mustSync(t, b, req)
	fs, err = b.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(t, fs)
	n := 0
	for i, c := range cases {
		kinds, want := proxier.WantFrontends(c.sp, svcs[i].Targets, proxier.WantOptions{})
		for j, w := range want {
			g, ok := got[w.Key()]
			d := "not read"
			if ok {
				n++
				d = w.Diff(g)
			}
			wantDiff := socketOnly && slices.Contains(c.socketOnlyDiffs, kinds[j])
			if (d != "") != wantDiff {
				t.Errorf("%s %s %s: diff %q, want a diff: %t (%s)", c.name, kinds[j], w.Key(), d, wantDiff, g.Detail)
			}
			ranged := kinds[j] == proxier.KindLoadBalancer && len(c.sp.LoadBalancerSourceRanges) > 0
			if ok && c.sp.Protocol != model.SCTP && !ranged && !strings.Contains(g.Detail, "sockets: ") {
				t.Errorf("%s %s: the maps were not read: %s", c.name, w.Key(), g.Detail)
			}
		}
	}
	if n != len(got) {
		t.Errorf("%d frontends read, %d claimed", len(got), n)
	}
	// Without the backend: through the pinned link, and through the
	// cgroup (no PinPath).
	for _, pinned := range []bool{true, false} {
		c := cfg
		if !pinned {
			c.PinPath = ""
		}
		other, err := Inspect(t.Context(), c, f)
		if err != nil {
			t.Fatalf("Inspect (pinned %t): %v", pinned, err)
		}
		if !slices.EqualFunc(sortedFrontends(fs), sortedFrontends(other), frontendEqual) {
			t.Errorf("Inspect (pinned %t) = %v, the backend read %v", pinned, other, fs)
		}
	}
	c := cfg
	c.PinPath, c.CgroupPath = "", ""
	if _, err := Inspect(t.Context(), c, f); err == nil || !strings.Contains(err.Error(), "PinPath") {
		t.Errorf("Inspect without PinPath and CgroupPath: %v", err)
	}
	// A successor adopting the pins (Close leaves the pinned links
	// attached), before its first sync: the predecessor's program
	// serves the shared maps, and the table stays.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	be2, err := NewBackend(cfg, f)
	if err != nil {
		t.Fatal(err)
	}
	b2 := be2.(*backend)
	cur = &b2
	if fs2, err := b2.Inspect(t.Context()); err != nil || !slices.EqualFunc(sortedFrontends(fs), sortedFrontends(fs2), frontendEqual) {
		t.Errorf("successor before its first sync read %v, %v; the predecessor %v", fs2, err, fs)
	}
}

func sortedFrontends(fs []proxier.Frontend) []proxier.Frontend {
	return slices.SortedFunc(slices.Values(fs), func(a, b proxier.Frontend) int { return strings.Compare(a.Key(), b.Key()) })
}

func frontendEqual(a, b proxier.Frontend) bool {
	return a.Key() == b.Key() && a.Diff(b) == "" && a.Detail == b.Detail
}

// BenchmarkInspect reads back 10,000 service ports of 10 endpoints
// (SocketOnly: the maps alone; the nftables table costs what
// backends/nftables's Inspect does), with random and Maglev selection.
//
//	go test ./backends/ebpf -run='^$' -bench=Inspect -benchtime=5x
func BenchmarkInspect(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	req := request(model.IPv4, backendtest.ScaleServices(10000, 10), nil)
	for _, sel := range selections {
		b.Run(fmt.Sprintf("%s/services=10000", sel), func(b *testing.B) {
			be := benchBackend(b, tn.Node1.Path(), cg, sel)
			mustSync(b, be, req)
			var n int
			c := cputime.Process()
			for b.Loop() {
				fs, err := be.Inspect(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				n = len(fs)
			}
			b.ReportMetric(float64((cputime.Process()-c).Milliseconds())/float64(b.N), "cpu-ms/op")
			if n != 11000 {
				b.Errorf("read %d frontends, want 11,000", n)
			}
		})
	}
}

// TestInspectFindsProgramByNamespace: without PinPath, Inspect picks,
// among the programs attached to the cgroup, the one translating
// Config.NetNS; two such programs with maps of their own are an error.
func TestInspectFindsProgramByNamespace(t *testing.T) {
	testnet.RequireRoot(t)
	tn := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(t)
	f := model.IPv4
	start := func(ns string, x byte) Config {
		cfg := Config{
			Config:     proxier.Config{NetNS: ns, Families: []model.IPFamily{f}, Logger: testLogger(t)},
			CgroupPath: cg, SocketOnly: true,
			MaxServices: 64, MaxBackends: 64, MaxAffinity: 64, MaxSockets: 64,
		}
		be, err := NewBackend(cfg, f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		mustSync(t, be, request(f, []testSvc{svc("web", model.TCP, vip(f, x), 80, ap(vip(f, 100+x), 8080))}, nil))
		return cfg
	}
	cfg1 := start(tn.Node1.Path(), 1)
	cfg2 := start(tn.Node2.Path(), 2)
	for i, cfg := range []Config{cfg1, cfg2} {
		fs, err := Inspect(t.Context(), cfg, f)
		if err != nil {
			t.Fatalf("Inspect of proxier %d: %v", i+1, err)
		}
		if len(fs) != 1 || fs[0].Addr != vip(f, byte(i+1)) {
			t.Errorf("Inspect of proxier %d = %v, want its cluster IP %s", i+1, fs, vip(f, byte(i+1)))
		}
	}
	start(tn.Node1.Path(), 3)
	if _, err := Inspect(t.Context(), cfg1, f); err == nil || !strings.Contains(err.Error(), "PinPath") {
		t.Errorf("Inspect with two proxiers of one namespace on the cgroup: %v, want an error naming PinPath", err)
	}
}
