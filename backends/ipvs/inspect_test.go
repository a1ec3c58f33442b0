package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	mipvs "github.com/moby/ipvs"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// fakeKernel is what the kernel holds after a full sync of some service
// ports, built without one: the backend's table as the kernel lists it
// back (its skeleton's rules encoded, its sets and elements), the
// virtual servers and real servers as moby/ipvs reads them, and the
// addresses bound on the dummy interface.
type fakeKernel struct {
	fi    family
	nt    *nftnl.Table
	svcs  []*mipvs.Service
	dests map[vsKey][]*mipvs.Destination
	bound map[netip.Addr]bool
}

// newFakeKernel renders svcs with r, as a full sync programs them.
func newFakeKernel(t testing.TB, r *renderer, cfg *Config, svcs []svc) *fakeKernel {
	t.Helper()
	st, c := newState(), &change{}
	for _, s := range svcs {
		objs, err := r.render(s.Port, s.Targets)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.set(s.Port.Name, objs, c); err != nil {
			t.Fatal(err)
		}
	}
	k := &fakeKernel{fi: newFamily(r.fam, DefaultTableName), dests: map[vsKey][]*mipvs.Destination{}, bound: map[netip.Addr]bool{}}
	k.nt = tableOf(t, &k.fi, cfg, slices.SortedFunc(maps.Keys(st.elems), compareElems))
	it := &ipvsTable{fam: r.fam}
	for _, key := range slices.SortedFunc(maps.Keys(st.vs), compareKeys) {
		spec := st.vs[key]
		k.svcs = append(k.svcs, it.service(spec))
		for _, d := range spec.Dests {
			k.dests[key] = append(k.dests[key], it.dest(d, 1))
		}
	}
	for a := range st.addrs {
		k.bound[a] = true
	}
	return k
}

// tableOf returns the table the backend writes, as ReadTable returns it.
func tableOf(t testing.TB, fi *family, cfg *Config, elems []elem) *nftnl.Table {
	t.Helper()
	nt := &nftnl.Table{Proto: fi.table.proto, Name: fi.table.name, Elems: map[string][]nftnl.Elem{}}
	for _, d := range fi.skeleton(cfg) {
		c := nftnl.Chain{Name: d.name, Hook: d.hook}
		for _, r := range d.rules {
			enc, err := nftnl.Encode(fi.Proto, r)
			if err != nil {
				t.Fatal(err)
			}
			c.Rules = append(c.Rules, enc)
		}
		nt.Chains = append(nt.Chains, c)
	}
	for _, name := range setNames {
		nt.Sets = append(nt.Sets, fi.set(name))
	}
	for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
		nt.Elems[setProtocols] = append(nt.Elems[setProtocols], nftnl.Elem{Key: []byte{p.Number()}})
	}
	for _, e := range elems {
		nt.Elems[e.Set] = append(nt.Elems[e.Set], fi.element(e))
	}
	return nt
}

// vs returns the virtual server of key, for tests to change.
func (k *fakeKernel) vs(key string) *mipvs.Service {
	for _, s := range k.svcs {
		if sk, _ := serviceKey(s, k.fi.fam); sk.String() == key {
			return s
		}
	}
	return nil
}

// read converts the fake kernel's contents, by frontend key.
func (k *fakeKernel) read(t testing.TB) map[string]proxier.Frontend {
	t.Helper()
	fs, err := frontends(decodeTable(&k.fi, k.nt), k.bound, k.svcs, func(s *mipvs.Service) ([]*mipvs.Destination, error) {
		key, _ := serviceKey(s, k.fi.fam)
		return k.dests[key], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]proxier.Frontend{}
	for _, f := range fs {
		if _, dup := out[f.Key()]; dup {
			t.Errorf("frontend %s read twice", f.Key())
		}
		out[f.Key()] = f
	}
	return out
}

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

// inspectServices are service ports of most kinds: affinity, no
// endpoints, internalTrafficPolicy Local without a local endpoint, and
// a load balancer with source ranges and externalTrafficPolicy Local
// (node 192.0.2.1, local endpoint 10.244.1.2, remote 10.244.2.2), and
// one without a local endpoint.
func inspectServices() []svc {
	web := clusterSvc("web", model.TCP, "10.96.0.10", 80, "10.244.1.2:8080", "10.244.2.2:8080").With(func(sp *model.ServicePort) {
		sp.SessionAffinity, sp.AffinityTimeout = true, time.Hour
	})
	empty := clusterSvc("empty", model.UDP, "10.96.0.11", 53).With(func(sp *model.ServicePort) { sp.NodePort = 30053 })
	itp := clusterSvc("itp", model.TCP, "10.96.0.12", 80).With(func(sp *model.ServicePort) {
		sp.InternalPolicy = model.PolicyLocal
	}).WithTargets(nil, eps("10.244.2.2:8080"), true)
	local, remote := eps("10.244.1.2:8080"), eps("10.244.2.2:8080")
	lb := clusterSvc("lb", model.TCP, "10.96.0.13", 80).With(func(sp *model.ServicePort) {
		sp.NodePort = 30080
		sp.ExternalPolicy = model.PolicyLocal
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.7")}
		sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.9")}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.0/28")}
	}).WithTargets(slices.Concat(local, remote), local, true)
	lbDrop := clusterSvc("lb-drop", model.TCP, "10.96.0.14", 80).With(func(sp *model.ServicePort) {
		sp.NodePort = 30081
		sp.ExternalPolicy = model.PolicyLocal
	}).WithTargets(remote, nil, true)
	return []svc{web, empty, itp, lb, lbDrop}
}

func inspectRenderer() *renderer {
	r := testRenderer(model.IPv4, "192.0.2.1")
	r.nodeIP = netip.MustParseAddr("192.0.2.1")
	return r
}

func TestInspectFrontends(t *testing.T) {
	cfg := Config{}.WithDefaults()
	k := newFakeKernel(t, inspectRenderer(), &cfg, inspectServices())
	// A draining real server (weight 0) takes no new connection.
	webKey := vsKey{netip.MustParseAddr("10.96.0.10"), model.TCP, 80}
	k.dests[webKey] = append(k.dests[webKey], (&ipvsTable{fam: model.IPv4}).dest(netip.MustParseAddrPort("10.244.3.3:8080"), 0))
	got := k.read(t)

	lbRanges := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.0/28"), netip.MustParsePrefix("203.0.113.9/32")}
	want := map[string]proxier.Frontend{
		"10.96.0.10 tcp/80":   {Endpoints: aps("10.244.1.2:8080", "10.244.2.2:8080"), Affinity: true},
		"10.96.0.11 udp/53":   {Verdict: "reject"},
		"192.0.2.1 udp/30053": {Verdict: "reject"},
		"10.96.0.12 tcp/80":   {Verdict: "drop"},
		"10.96.0.13 tcp/80":   {Endpoints: aps("10.244.1.2:8080", "10.244.2.2:8080")},
		"192.0.2.1 tcp/30080": {Endpoints: aps("10.244.1.2:8080")},
		"198.51.100.7 tcp/80": {Endpoints: aps("10.244.1.2:8080")},
		"203.0.113.9 tcp/80":  {Endpoints: aps("10.244.1.2:8080"), SourceRanges: lbRanges},
		"10.96.0.14 tcp/80":   {Endpoints: aps("10.244.2.2:8080")},
		"192.0.2.1 tcp/30081": {Verdict: "drop"},
	}
	for key, w := range want {
		g, ok := got[key]
		if !ok {
			t.Errorf("%s: not read", key)
			continue
		}
		if d := w.Diff(g); d != "" {
			t.Errorf("%s: %s (detail %q)", key, d, g.Detail)
		}
		if (w.SourceRanges == nil) != (g.SourceRanges == nil) {
			t.Errorf("%s: source ranges %v, want %v", key, g.SourceRanges, w.SourceRanges)
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("unexpected frontend %s (%s)", key, got[key].Detail)
		}
	}
	if d := got["10.96.0.10 tcp/80"].Detail; d != "virtual server 10.96.0.10:80/TCP rr persistent 3600s, 2 real servers (+1 of weight 0)" {
		t.Errorf("detail %q", d)
	}
	if d := got["10.96.0.11 udp/53"].Detail; !strings.Contains(d, "reject by table proxykit-ipvs before IPVS") {
		t.Errorf("detail %q", d)
	}
}

// TestInspectAgainstWant sets the frontends read beside those
// proxier.WantFrontends asks for without the short circuit (the
// documented difference of IPVS, docs/KUBE-PROXY-DIFFERENCES.md: with
// externalTrafficPolicy Local the external virtual servers hold the local
// endpoints for every source): they agree.
func TestInspectAgainstWant(t *testing.T) {
	cfg := Config{}.WithDefaults()
	r := inspectRenderer()
	svcs := inspectServices()
	got := newFakeKernel(t, r, &cfg, svcs).read(t)
	for _, s := range svcs {
		kinds, wants := proxier.WantFrontends(s.Port, s.Targets, proxier.WantOptions{NodeIP: r.nodeIP, NoShortCircuit: true})
		for i, w := range wants {
			at := w
			if kinds[i] == proxier.KindNodePort {
				at.Addr = r.nodeAddrs[0] // read per node address
			}
			key := at.Key()
			g, ok := got[key]
			if !ok {
				t.Errorf("%s %s: not read", s.Port.Name, key)
				continue
			}
			if d := w.Diff(g); d != "" {
				t.Errorf("%s %s %s: diff %q", s.Port.Name, kinds[i], key, d)
			}
		}
	}
}

// TestInspectOwnership: virtual servers neither recorded in the table nor
// on the dummy interface's addresses are another program's; one on the
// interface but not recorded is the backend's, and the table rejects it
// (a service address on a port that is no service port). A key the table
// rejects without a virtual server is a frontend too.
func TestInspectOwnership(t *testing.T) {
	cfg := Config{}.WithDefaults()
	k := newFakeKernel(t, inspectRenderer(), &cfg, inspectServices())
	it := &ipvsTable{fam: model.IPv4}
	foreign := &vsSpec{Key: vsKey{netip.MustParseAddr("10.0.0.99"), model.TCP, 80}, Sched: "rr"}
	stray := &vsSpec{Key: vsKey{netip.MustParseAddr("10.96.0.10"), model.TCP, 81}, Sched: "rr"}
	k.svcs = append(k.svcs, it.service(foreign), it.service(stray))
	k.dests[foreign.Key] = []*mipvs.Destination{it.dest(netip.MustParseAddrPort("10.0.1.1:80"), 1)}
	k.dests[stray.Key] = []*mipvs.Destination{it.dest(netip.MustParseAddrPort("10.0.1.1:80"), 1)}
	// The empty service's UDP virtual server is gone; its key is still
	// rejected.
	k.svcs = slices.DeleteFunc(k.svcs, func(s *mipvs.Service) bool { return s == k.vs("10.96.0.11:53/UDP") })
	got := k.read(t)
	if f, ok := got["10.0.0.99 tcp/80"]; ok {
		t.Errorf("another program's virtual server read: %+v", f)
	}
	if f := got["10.96.0.10 tcp/81"]; f.Verdict != "reject" || len(f.Endpoints) != 0 {
		t.Errorf("unrecorded virtual server on the interface: %+v, want rejected", f)
	}
	if f := got["10.96.0.11 udp/53"]; f.Verdict != "reject" || !strings.HasPrefix(f.Detail, "no virtual server") {
		t.Errorf("rejected key without a virtual server: %+v", f)
	}
}

// TestInspectUnhookedTable: sets whose chains are not hooked, or whose
// rules are missing, decide nothing, and without a table only the virtual servers on the dummy
// interface are the backend's.
func TestInspectUnhookedTable(t *testing.T) {
	cfg := Config{}.WithDefaults()
	k := newFakeKernel(t, inspectRenderer(), &cfg, inspectServices())
	for i := range k.nt.Chains {
		if k.nt.Chains[i].Name == chainInput {
			k.nt.Chains[i].Rules = nil
		}
	}
	got := k.read(t)
	if f := got["10.96.0.11 udp/53"]; f.Verdict != "" {
		t.Errorf("verdict %q from a table whose input chain is empty", f.Verdict)
	}
	if f := got["203.0.113.9 tcp/80"]; f.SourceRanges != nil {
		t.Errorf("source ranges %v from a table whose input chain is empty", f.SourceRanges)
	}
	// The rules decide, not the sets alone: without the services
	// chain's drop rule nothing is dropped.
	k = newFakeKernel(t, inspectRenderer(), &cfg, inspectServices())
	for i := range k.nt.Chains {
		if c := &k.nt.Chains[i]; c.Name == chainServices {
			c.Rules = c.Rules[1:]
		}
	}
	got = k.read(t)
	if f := got["10.96.0.12 tcp/80"]; f.Verdict != "" || len(f.Endpoints) != 0 {
		t.Errorf("without the drop rule: %+v, want no verdict and no real server", f)
	}
	if f := got["10.96.0.11 udp/53"]; f.Verdict != "reject" {
		t.Errorf("without the drop rule, no endpoints: %+v, want rejected", f)
	}
	k.nt = nil
	got = k.read(t)
	if _, ok := got["192.0.2.1 tcp/30080"]; ok {
		t.Error("a node port virtual server is read without the table that records it")
	}
	if f, ok := got["10.96.0.10 tcp/80"]; !ok || len(f.Endpoints) != 2 {
		t.Errorf("cluster IP virtual server without the table: %+v", f)
	}
}

func TestInspectIPv6(t *testing.T) {
	cfg := Config{}.WithDefaults()
	r := testRenderer(model.IPv6, "2001:db8::1")
	lb := clusterSvc("lb", model.TCP, "fd00:10:96::10", 80, "[fd00:10:244:1::2]:8080").With(func(sp *model.ServicePort) {
		sp.NodePort = 30080
		sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("2001:db8:1::9")}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:2::/48")}
	})
	empty := clusterSvc("empty", model.SCTP, "fd00:10:96::11", 7777)
	got := newFakeKernel(t, r, &cfg, []svc{lb, empty}).read(t)
	if f := got["2001:db8:1::9 tcp/80"]; !slices.Equal(f.SourceRanges, []netip.Prefix{netip.MustParsePrefix("2001:db8:2::/48")}) ||
		!slices.Equal(f.Endpoints, aps("[fd00:10:244:1::2]:8080")) {
		t.Errorf("load balancer: %+v", f)
	}
	if f := got["2001:db8::1 tcp/30080"]; len(f.Endpoints) != 1 {
		t.Errorf("node port: %+v", f)
	}
	if f := got["fd00:10:96::11 sctp/7777"]; f.Verdict != "reject" {
		t.Errorf("no endpoints: %+v", f)
	}
	if len(got) != 4 {
		t.Errorf("read %d frontends, want 4: %v", len(got), slices.Sorted(maps.Keys(got)))
	}
}

// BenchmarkInspectConvert converts what the kernel holds for 10,000
// service ports of 10 endpoints (every tenth with a node port on 4 node
// addresses); the kernel is not read.
func BenchmarkInspectConvert(b *testing.B) {
	cfg := Config{}.WithDefaults()
	r := testRenderer(model.IPv4, "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4")
	k := newFakeKernel(b, r, &cfg, backendtest.ScaleServices(10000, 10))
	dests := func(s *mipvs.Service) ([]*mipvs.Destination, error) {
		key, _ := serviceKey(s, k.fi.fam)
		return k.dests[key], nil
	}
	for b.Loop() {
		fs, err := frontends(decodeTable(&k.fi, k.nt), k.bound, k.svcs, dests)
		if err != nil || len(fs) != len(k.svcs) {
			b.Fatalf("%d frontends of %d virtual servers: %v", len(fs), len(k.svcs), err)
		}
	}
}

// BenchmarkInspect reads back n service ports of 10 endpoints (every
// tenth with a node port) from the kernel, through the backend; the first
// iteration logs how long each part of the read takes.
func BenchmarkInspect(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			be := benchBackend(b)
			if err := be.Sync(b.Context(), request(model.IPv4, backendtest.ScaleServices(n, 10))); err != nil {
				b.Fatal(err)
			}
			logInspectPhases(b, be)
			for b.Loop() {
				fs, err := be.Inspect(b.Context())
				if err != nil || len(fs) < n {
					b.Fatalf("%d frontends of %d service ports: %v", len(fs), n, err)
				}
			}
		})
	}
}

// logInspectPhases logs how long reading the table, listing the virtual
// servers and listing their real servers take.
func logInspectPhases(b *testing.B, be *backend) {
	b.Helper()
	t0 := time.Now()
	if _, err := be.nft.c.(tableReader).ReadTable(b.Context(), be.fi.table.proto, be.fi.table.name); err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	svcs, err := dumpServices(be.ipvs.h)
	if err != nil {
		b.Fatal(err)
	}
	t2 := time.Now()
	for _, s := range svcs {
		if _, err := be.ipvs.h.GetDestinations(s); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("table %v, %d virtual servers %v, their real servers %v", t1.Sub(t0), len(svcs), t2.Sub(t1), time.Since(t2))
}

// TestInspectKernel reads a real IPVS table back, through the backend and
// without a proxier: a real server of weight 0 is no endpoint, and a
// service without endpoints is rejected.
func TestInspectKernel(t *testing.T) {
	e := newKernelEnv(t, model.IPv4)
	b := e.backend(Config{})
	p1, p2 := e.tn.Node1.Pods[0], e.tn.Node2.Pods[0]
	web := clusterSvc("web", model.TCP, e.vip(10), 80, e.ep(p1, 8080), e.ep(p2, 8080)).With(func(sp *model.ServicePort) { sp.NodePort = 30080 })
	empty := clusterSvc("empty", model.UDP, e.vip(11), 53)
	e.sync(b, request(model.IPv4, []svc{web, empty}))
	// A real server draining (as a removed one with connections left
	// is): weight 0.
	webKey := vsKey{netip.MustParseAddr(e.vip(10)), model.TCP, 80}
	if err := b.ipvs.setWeight(webKey, netip.MustParseAddrPort(e.ep(p2, 8080)), 0); err != nil {
		t.Fatal(err)
	}
	fromBackend, err := b.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	fromNS, err := Inspect(t.Context(), Config{Config: proxier.Config{NetNS: e.tn.Node1.Path()}}, model.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, fs := range [][]proxier.Frontend{fromBackend, fromNS} {
		byKey := map[string]proxier.Frontend{}
		for _, f := range fs {
			byKey[f.Key()] = f
		}
		w := byKey[e.vip(10)+" tcp/80"]
		if !slices.Equal(w.Endpoints, aps(e.ep(p1, 8080))) || !strings.Contains(w.Detail, "+1 of weight 0") {
			t.Errorf("web: %+v, want %s only and %s draining", w, e.ep(p1, 8080), e.ep(p2, 8080))
		}
		if f := byKey[e.vip(11)+" udp/53"]; f.Verdict != "reject" {
			t.Errorf("empty: %+v, want rejected", f)
		}
		nodePorts := 0
		for _, f := range fs {
			if f.Port == 30080 {
				nodePorts++
				if !slices.Equal(f.Endpoints, aps(e.ep(p1, 8080), e.ep(p2, 8080))) {
					t.Errorf("node port %s: %+v", f.Key(), f)
				}
			}
		}
		if nodePorts == 0 {
			t.Errorf("no node port read: %v", slices.Sorted(maps.Keys(byKey)))
		}
	}
}

// TestInspectCleanNamespace: without a proxier, a namespace the backend
// never programmed holds no frontend, whether or not the kernel has IPVS;
// an unknown family is refused.
func TestInspectCleanNamespace(t *testing.T) {
	testnet.RequireRoot(t)
	tn := testnet.New(t, testnet.Options{})
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		fs, err := Inspect(t.Context(), Config{Config: proxier.Config{NetNS: tn.Node1.Path()}}, f)
		if err != nil || len(fs) != 0 {
			t.Errorf("%s: %v, %v; want nothing", f, fs, err)
		}
	}
	if _, err := Inspect(t.Context(), Config{Config: proxier.Config{NetNS: tn.Node1.Path()}}, 0); err == nil {
		t.Error("family 0 accepted")
	}
}
