package nftables

import (
	"bytes"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Rootless tests of rendering and diffing: no kernel involved.

func testRenderer(t *testing.T, f model.IPFamily, clusterCIDRs bool) *renderer {
	t.Helper()
	r, err := newRenderer(familyInfoOf(f), proxier.DefaultMasqueradeBit, 16, false, clusterCIDRs, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// noneTaken is a prefixTaken with no other service ports.
func noneTaken(string, []byte) bool { return false }

// testAIDs returns an affinity id allocator.
func testAIDs() func() uint32 {
	next := uint32(0)
	return func() uint32 { next++; return next }
}

// elemsOf returns the elements of set in o.
func elemsOf(o *svcObjs, set string) []elem {
	var out []elem
	all := o.ownElems()
	fi := familyInfoOf(model.IPv4)
	o.eachRef(func(set string, a netip.Addr) {
		if a.Is6() {
			fi = familyInfoOf(model.IPv6)
		}
		all = append(all, setElem{set: set, e: elem{Key: fi.refKey(nil, set, a)}})
	})
	for _, e := range all {
		if e.set == set {
			out = append(out, e.e)
		}
	}
	return out
}

func chainNamesOf(o *svcObjs) []string {
	var out []string
	for _, c := range o.chains {
		out = append(out, c.name)
	}
	return out
}

func TestRenderClusterIP(t *testing.T) {
	r := testRenderer(t, model.IPv4, false)
	s := clusterSvc("web", model.TCP, "10.96.0.1", 80, "10.0.1.2:8080", "10.0.2.2:8080")
	o, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 7, newAID: testAIDs(), taken: noneTaken})
	if err != nil {
		t.Fatal(err)
	}
	// Balanced from the shared chain of its shard: no chain of its own.
	if got := chainNamesOf(o); len(got) != 0 {
		t.Fatalf("chains %v", got)
	}
	shard, _ := groupOf(7, 0)
	disp := elemsOf(o, setServiceIPs)
	if len(disp) != 1 || disp[0].Verdict == nil || disp[0].Verdict.Chain != sharedChain(chainClusterPrefix, shard) || disp[0].Verdict.Code != unix.NFT_GOTO {
		t.Fatalf("dispatch %+v", disp)
	}
	wantKey := []byte{10, 96, 0, 1, unix.IPPROTO_TCP, 0, 0, 0, 0, 80, 0, 0}
	if !slices.Equal(disp[0].Key, wantKey) {
		t.Fatalf("dispatch key %v, want %v", disp[0].Key, wantKey)
	}
	// Two ranges, [0, 32767) and [32767, 65535), under the packet's own
	// daddr . proto . dport.
	eps := elemsOf(o, endpointsMap(shard, 0))
	wantPos := []uint32{0, 32767, 32767, 65535}
	if len(eps) != 4 {
		t.Fatalf("endpoints %v", eps)
	}
	for i, e := range eps {
		want := concat(wantKey, positionKey(wantPos[i]))
		if !slices.Equal(e.Key, want) || e.IntervalEnd != (i%2 == 1) {
			t.Errorf("endpoint element %d: key %x end %v, want %x end %v", i, e.Key, e.IntervalEnd, want, i%2 == 1)
		}
	}
	if !slices.Equal(eps[2].Val, []byte{10, 0, 2, 2, 0x1f, 0x90, 0, 0}) {
		t.Errorf("endpoint value %v", eps[2].Val)
	}
	if n := len(elemsOf(o, setHairpin)); n != 2 {
		t.Errorf("%d hairpin elements, want 2", n)
	}
	if n := len(elemsOf(o, setClusterIPs)); n != 1 {
		t.Errorf("%d cluster IP elements, want 1", n)
	}
	if n := len(elemsOf(o, setNoEndpointIPs)); n != 0 {
		t.Errorf("no-endpoint elements for a service with endpoints")
	}

	// With its prefix taken (an IPv6 hash collision), it gets a chain of
	// its own, whose rule does not change with the endpoints either.
	taken := func(string, []byte) bool { return true }
	o, err = r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 7, newAID: testAIDs(), taken: taken})
	if err != nil {
		t.Fatal(err)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"svc-default/web/tcp"}) || len(o.chains[0].enc) != 1 {
		t.Fatalf("chains %v", got)
	}
	s3 := clusterSvc("web", model.TCP, "10.96.0.1", 80, "10.0.1.2:8080", "10.0.2.2:8080", "10.0.3.2:8080")
	o3, err := r.service(s3.Port.Name, s3.Port, s3.Targets, svcAlloc{id: 7, prev: o, newAID: testAIDs(), taken: taken})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(o3.chains[0].enc, o.chains[0].enc, bytes.Equal) {
		t.Errorf("the balancing rule changed with the number of endpoints")
	}
	if n := len(elemsOf(o3, endpointsMap(shard, 0))); n != 6 {
		t.Errorf("%d range elements for 3 endpoints, want 6", n)
	}
}

func TestJhashMatchesKernel(t *testing.T) {
	// Values of the kernel's jhash(): lookup3 hashlittle() on a
	// little-endian host, checked against Bob Jenkins' test vectors.
	if !nativeLittle {
		t.Skip("vectors are for little-endian hosts")
	}
	for _, v := range []struct {
		in   string
		seed uint32
		want uint32
	}{
		{"", 0, 0xdeadbeef},
		{"", 0xdeadbeef, 0xbd5b7dde},
		{"Four score and seven years ago", 0, 0x17770551},
		{"Four score and seven years ago", 1, 0xcd628161},
	} {
		if got := nftnl.Jhash([]byte(v.in), v.seed); got != v.want {
			t.Errorf("jhash(%q, %#x) = %#x, want %#x", v.in, v.seed, got, v.want)
		}
	}
}

func TestRenderNoEndpoints(t *testing.T) {
	r := testRenderer(t, model.IPv4, false)
	s := clusterSvc("empty", model.UDP, "10.96.0.2", 53)
	s.Port.NodePort = 30053
	s.Port.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
	o, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 1, newAID: testAIDs(), taken: noneTaken})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.chains) != 0 {
		t.Fatalf("chains %v", chainNamesOf(o))
	}
	ips, ports := elemsOf(o, setNoEndpointIPs), elemsOf(o, setNoEndpointPorts)
	if len(ips) != 2 || len(ports) != 1 {
		t.Fatalf("no-endpoint elements: %d addresses, %d ports", len(ips), len(ports))
	}
	for _, e := range append(ips, ports...) {
		if e.Verdict.Code != unix.NFT_GOTO || e.Verdict.Chain != chainReject {
			t.Errorf("verdict %+v, want goto reject", e.Verdict)
		}
	}
}

func TestRenderPolicies(t *testing.T) {
	r := testRenderer(t, model.IPv4, true)
	// Internal Local without local endpoints, external Cluster: cluster IP
	// dropped, node port balanced with masquerade from the shared chain.
	s := clusterSvc("mixed", model.TCP, "10.96.0.3", 80)
	s.Port.NodePort = 30080
	s.Port.InternalPolicy = model.PolicyLocal
	s.Targets = &proxier.Targets{HasEndpoints: true, External: eps("10.0.1.2:8080")}
	o, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 2, newAID: testAIDs(), taken: noneTaken})
	if err != nil {
		t.Fatal(err)
	}
	if got := chainNamesOf(o); len(got) != 0 {
		t.Fatalf("chains %v", got)
	}
	if d := elemsOf(o, setNoEndpointIPs); len(d) != 1 || d[0].Verdict.Code != nfDrop {
		t.Fatalf("cluster IP: %+v, want drop", d)
	}
	shard, _ := groupOf(2, 0)
	if d := elemsOf(o, setServiceNodePorts); len(d) != 1 || d[0].Verdict.Chain != sharedChain(chainNodePortPrefix, shard) {
		t.Fatalf("node port: %+v, want goto %s", d, sharedChain(chainNodePortPrefix, shard))
	}
	if n := len(elemsOf(o, endpointsMap(shard, 0))); n != 2 {
		t.Errorf("%d range elements, want 2 (the node port's)", n)
	}

	// External Local without local endpoints: the node port is dropped
	// after DNAT, and its chain sends only pods and the node on (to the
	// cluster endpoints).
	s = clusterSvc("local", model.TCP, "10.96.0.4", 80, "10.0.2.2:8080")
	s.Port.NodePort = 30081
	s.Port.ExternalPolicy = model.PolicyLocal
	s.Targets.External = nil
	o, err = r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 3, newAID: testAIDs(), taken: noneTaken})
	if err != nil {
		t.Fatal(err)
	}
	if d := elemsOf(o, setNoEndpointPorts); len(d) != 1 || d[0].Verdict.Code != nfDrop {
		t.Fatalf("node port: %+v, want drop", d)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"ext-default/local/tcp"}) || len(o.chains[0].enc) != 2 {
		t.Fatalf("chains %v, want the external chain with the pod and node rules", got)
	}
	if d := elemsOf(o, setServiceNodePorts); len(d) != 1 || d[0].Verdict.Chain != "ext-default/local/tcp" {
		t.Fatalf("node port: %+v, want goto the external chain", d)
	}

	// External Local with a local endpoint: a chain of its own, sending
	// pods and the node to the cluster endpoints (the cluster IP's range
	// set), others to the local one.
	s = clusterSvc("local2", model.TCP, "10.96.0.5", 80, "10.0.1.2:8080", "10.0.2.2:8080")
	s.Port.NodePort = 30082
	s.Port.ExternalPolicy = model.PolicyLocal
	s.Targets.External = eps("10.0.2.2:8080")
	o, err = r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 4, newAID: testAIDs(), taken: noneTaken})
	if err != nil {
		t.Fatal(err)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"ext-default/local2/tcp"}) || len(o.chains[0].enc) != 3 {
		t.Fatalf("chains %v", got)
	}
	shard, local := groupOf(4, 1)
	if n := len(elemsOf(o, endpointsMap(shard, 0))); n != 4+2 {
		t.Errorf("%d range elements, want 6", n)
	}
	wantOwn, err := encodeExprs(r.fi.proto, r.fi.prefixRule(shard, 0, groupPrefix(local)))
	if err != nil || !slices.Equal(o.chains[0].enc[2], wantOwn) {
		t.Errorf("last rule does not balance over the local endpoints")
	}

	// The shared cluster chains masquerade traffic from outside the
	// cluster.
	masq := testRenderer(t, model.IPv4, true)
	cl, err := masq.object(shardRef{kind: objCluster}, 1)
	if err != nil || cl.chain == nil || cl.chain.name != sharedChain(chainClusterPrefix, 0) ||
		len(cl.chain.enc) == 0 || !slices.Equal(cl.chain.enc[0], masq.jumpMasq) {
		t.Errorf("cluster chain does not jump to %s: %v", chainMasqCluster, err)
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	r := testRenderer(t, model.IPv4, false)
	s := clusterSvc("v6", model.TCP, "fd00::1", 80, "10.0.1.2:80")
	if _, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 1, newAID: testAIDs(), taken: noneTaken}); err == nil {
		t.Error("IPv6 cluster IP in an IPv4 backend accepted")
	}
	s = clusterSvc("bad", "ICMP", "10.96.0.1", 80)
	if _, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 1, newAID: testAIDs(), taken: noneTaken}); err == nil {
		t.Error("bad protocol accepted")
	}
	s = clusterSvc(strings.Repeat("x", 300), model.TCP, "10.96.0.1", 80)
	if _, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 1, newAID: testAIDs(), taken: noneTaken}); err == nil {
		t.Error("over-long name accepted")
	}
}

func TestStableSlots(t *testing.T) {
	a, b, c, d := ap("10.0.0.1:1"), ap("10.0.0.2:1"), ap("10.0.0.3:1"), ap("10.0.0.4:1")
	e, f := ap("10.0.0.5:1"), ap("10.0.0.6:1")
	for _, tc := range []struct {
		name      string
		prev, eps []netip.AddrPort
		want      []netip.AddrPort
	}{
		{"fresh", nil, []netip.AddrPort{a, b}, []netip.AddrPort{a, b}},
		{"append", []netip.AddrPort{a, b}, []netip.AddrPort{c, a, b}, []netip.AddrPort{a, b, c}},
		{"remove middle", []netip.AddrPort{a, b, c}, []netip.AddrPort{a, c}, []netip.AddrPort{a, c}},
		{"remove first", []netip.AddrPort{a, b, c}, []netip.AddrPort{b, c}, []netip.AddrPort{c, b}},
		{"remove last", []netip.AddrPort{a, b, c}, []netip.AddrPort{a, b}, []netip.AddrPort{a, b}},
		{"replace", []netip.AddrPort{a, b, c}, []netip.AddrPort{a, d, c}, []netip.AddrPort{a, d, c}},
		{"replace first", []netip.AddrPort{a, b, c}, []netip.AddrPort{d, b, c}, []netip.AddrPort{d, b, c}},
		{"replace two, remove one", []netip.AddrPort{a, b, c, d}, []netip.AddrPort{e, f}, []netip.AddrPort{e, f}},
		{"remove two, add one", []netip.AddrPort{a, b, c, d}, []netip.AddrPort{e, c, a}, []netip.AddrPort{a, e, c}},
		{"all gone", []netip.AddrPort{a, b}, nil, []netip.AddrPort{}},
	} {
		if got := stableSlots(tc.prev, tc.eps); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestNormalizeRanges(t *testing.T) {
	p := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	got := normalizeRanges(model.IPv4, p("10.1.0.0/16", "10.0.0.0/8", "192.168.0.0/24", "192.168.1.0/24", "fd00::/8"))
	want := [][2]netip.Addr{
		{netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.255.255.255")},
		{netip.MustParseAddr("192.168.0.0"), netip.MustParseAddr("192.168.1.255")},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	fi := familyInfoOf(model.IPv4)
	els := fi.intervalElems(normalizeRanges(model.IPv4, p("0.0.0.0/0")))
	if len(els) != 1 || els[0].IntervalEnd {
		t.Fatalf("0.0.0.0/0 gives %+v, want a single start element", els)
	}
}

// offlineBackend is a backend without a kernel: enough to render and diff.
func offlineBackend(t *testing.T) *backend {
	t.Helper()
	cfg := Config{}.WithDefaults()
	b := &backend{cfg: cfg, fi: familyInfoOf(model.IPv4), log: slog.New(slog.DiscardHandler)}
	b.r = testRenderer(t, model.IPv4, false)
	return b
}

// messages lists the labels of a batch.
func messages(tx *nftnl.Batch) []string {
	var out []string
	for i := range tx.Len() {
		s, o := tx.Label(i)
		if svc, _ := o.(*model.ServicePortName); svc != nil {
			s = svc.String() + ": " + s
		}
		out = append(out, s)
	}
	return out
}

func TestIncrementalTouchesOnlyChanged(t *testing.T) {
	b := offlineBackend(t)
	svcs := backendtest.ScaleServices(50, 3)
	st, errs := b.buildFull(request(model.IPv4, svcs, nil), true, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.st = st

	// One endpoint added to one service.
	changed := svcs[7]
	grown := changed.WithAdded(backendtest.Endpoint("10.200.0.1:8080"))
	svcs[7] = grown
	d, tx, errs, err := b.buildIncremental(request(model.IPv4, svcs, backendtest.Names(grown)), map[model.ServicePortName]error{})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	msgs := messages(tx)
	name := changed.Port.Name.String()
	for _, m := range msgs {
		if !strings.HasPrefix(m, name+": ") && !strings.Contains(m, setHairpin) {
			t.Errorf("message for something else: %q", m)
		}
	}
	// No rule changes: the group's ranges are replaced (one more
	// endpoint moves every boundary but the first) and one hairpin
	// element is added. Nothing else.
	shard, _ := groupOf(st.services[changed.Port.Name].id, 0)
	want := []string{
		name + ": delete elements from " + endpointsMap(shard, 0),
		name + ": add elements to " + endpointsMap(shard, 0),
		"add elements to hairpin",
	}
	if !slices.Equal(msgs, want) {
		t.Errorf("messages:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	d.apply()

	// Deleting a service removes its dispatch element and its ranges.
	svcs = slices.Delete(svcs, 7, 8)
	_, tx, _, err = b.buildIncremental(request(model.IPv4, svcs, backendtest.Names(grown)), map[model.ServicePortName]error{})
	if err != nil {
		t.Fatal(err)
	}
	msgs = messages(tx)
	for _, m := range []string{name + ": delete elements from " + setServiceIPs, name + ": delete elements from " + endpointsMap(shard, 0)} {
		if !slices.Contains(msgs, m) {
			t.Errorf("no %q in:\n%s", m, strings.Join(msgs, "\n"))
		}
	}
}

// TestIncrementalReplaceWritesOneRange: replacing one endpoint of a big
// group replaces that endpoint's range (start and end) under each of the
// group's prefixes, and its hairpin element: not the whole group.
func TestIncrementalReplaceWritesOneRange(t *testing.T) {
	b := offlineBackend(t)
	svcs := scale.Services(3, 100)
	base := backendtest.ScaleServices(3, 100) // service 0 has a node port
	st, errs := b.buildFull(request(model.IPv4, base, nil), true, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.st = st
	replaced := slices.Clone(base)
	replaced[0] = backendtest.FromScale(svcs[0].WithEndpoint(40, scale.ReplacementEndpoint(0)))
	d, tx, errs, err := b.buildIncremental(request(model.IPv4, replaced, backendtest.Names(base[0])), map[model.ServicePortName]error{})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	// Cluster IP and node port prefixes: two elements deleted and two
	// added each; hairpin: one deleted, one added.
	if got := tx.Elems(); got != 10 {
		t.Errorf("%d elements written, want 10:\n%s", got, strings.Join(messages(tx), "\n"))
	}
	d.apply()
	objs := b.st.services[base[0].Port.Name].objs
	if got := objs.slots[0][40]; got.Addr() != scale.ReplacementEndpoint(0) {
		t.Errorf("slot 40 holds %v, want the replacement", got)
	}
	// A full sync of the same state writes the same ranges.
	full, _ := b.buildFull(request(model.IPv4, replaced, nil), false, nil)
	if !slices.Equal(full.services[base[0].Port.Name].objs.slots[0], objs.slots[0]) {
		t.Error("a full sync orders the slots differently")
	}
}

// TestChainDeletedAfterDispatch: a chain's dispatch element goes before the chain.
func TestChainDeletedAfterDispatch(t *testing.T) {
	b := offlineBackend(t)
	s := clusterSvc("sticky", model.TCP, "10.96.0.1", 80, "10.0.1.2:80")
	s.Port.SessionAffinity = true
	st, errs := b.buildFull(request(model.IPv4, []testSvc{s}, nil), true, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.st = st
	_, tx, _, err := b.buildIncremental(request(model.IPv4, nil, backendtest.Names(s)), map[model.ServicePortName]error{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := messages(tx)
	name := s.Port.Name.String()
	iDel := slices.Index(msgs, name+": delete chain svc-default/sticky/tcp")
	iElem := slices.Index(msgs, name+": delete elements from "+setServiceIPs)
	if iDel < 0 || iElem < 0 || iElem > iDel {
		t.Errorf("delete order wrong:\n%s", strings.Join(msgs, "\n"))
	}
}

func TestConflictingAddressesReported(t *testing.T) {
	b := offlineBackend(t)
	a := clusterSvc("a", model.TCP, "10.96.0.1", 80, "10.0.1.2:80")
	dup := clusterSvc("b", model.TCP, "10.96.0.1", 80, "10.0.1.3:80")
	st, errs := b.buildFull(request(model.IPv4, []testSvc{a, dup}, nil), true, nil)
	if len(st.services) != 1 || errs[dup.Port.Name] == nil {
		t.Fatalf("services %d, errors %v: want b reported", len(st.services), errs)
	}
	err := proxier.JoinObjectErrors(errs)
	var oe *proxier.ObjectError
	if !errorsAs(err, &oe) || oe.Service != dup.Port.Name {
		t.Fatalf("error %v is not an ObjectError for b", err)
	}
}

// TestRenderSourceRangesNodeIP: a source range holding the node's address
// admits the service's load-balancer IPs as sources too (kube-proxy's
// allowFromNode); otherwise only the ranges are admitted.
func TestRenderSourceRangesNodeIP(t *testing.T) {
	s := clusterSvc("lb", model.TCP, "10.96.0.9", 80, "10.0.1.2:8080")
	lb := netip.MustParseAddr("203.0.113.10")
	s.Port.LoadBalancerIPs = []netip.Addr{lb}
	s.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/25")}
	for _, tc := range []struct {
		node string
		want int // allowed-source elements
	}{{"", 1}, {"192.0.2.200", 1}, {"192.0.2.7", 2}} {
		var node netip.Addr
		if tc.node != "" {
			node = netip.MustParseAddr(tc.node)
		}
		r, err := newRenderer(familyInfoOf(model.IPv4), proxier.DefaultMasqueradeBit, 16, false, false, node)
		if err != nil {
			t.Fatal(err)
		}
		o, err := r.service(s.Port.Name, s.Port, s.Targets, svcAlloc{id: 1, newAID: testAIDs(), taken: noneTaken})
		if err != nil {
			t.Fatal(err)
		}
		allow := elemsOf(o, setFirewallAllow)
		if len(allow) != tc.want {
			t.Fatalf("node %q: %d allowed sources, want %d", tc.node, len(allow), tc.want)
		}
		if tc.want == 2 {
			k := r.fi.ipKey(lb, model.TCP, 80)
			vip := concat(k, r.fi.Addr(lb))
			if !slices.ContainsFunc(allow, func(e elem) bool { return bytes.Equal(e.Key, vip) && bytes.Equal(e.KeyEnd, vip) }) {
				t.Errorf("node %q: the VIP is not an allowed source: %+v", tc.node, allow)
			}
		}
	}
}
