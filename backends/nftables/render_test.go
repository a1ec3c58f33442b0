package nftables

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Rootless tests of rendering and diffing: no kernel involved.

func testRenderer(t *testing.T, f model.IPFamily, clusterCIDRs bool) *renderer {
	t.Helper()
	r, err := newRenderer(familyInfoOf(f), DefaultMasqueradeBit, false, clusterCIDRs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// elemsOf returns the elements of set in o.
func elemsOf(o *svcObjs, set string) []elem {
	var out []elem
	for _, e := range o.elems {
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
	o, err := r.service(s.sp.Name, s.sp, s.t, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"svc-default/web/tcp"}) {
		t.Fatalf("chains %v", got)
	}
	if n := len(o.chains[0].enc); n != 1 {
		t.Fatalf("%d rules, want 1", n)
	}
	disp := elemsOf(o, setServiceIPs)
	if len(disp) != 1 || disp[0].verdict == nil || disp[0].verdict.chain != "svc-default/web/tcp" || disp[0].verdict.code != unix.NFT_GOTO {
		t.Fatalf("dispatch %+v", disp)
	}
	wantKey := []byte{10, 96, 0, 1, unix.IPPROTO_TCP, 0, 0, 0, 0, 80, 0, 0}
	if !slices.Equal(disp[0].key, wantKey) {
		t.Fatalf("dispatch key %v, want %v", disp[0].key, wantKey)
	}
	gi, _ := groupIDs(7)
	eps := elemsOf(o, endpointsMap(shardOf(gi)))
	if len(eps) != 2 {
		t.Fatalf("endpoints %v", eps)
	}
	for i, e := range eps {
		if binary.NativeEndian.Uint32(e.key) != gi || binary.NativeEndian.Uint32(e.key[4:]) != uint32(i) {
			t.Errorf("endpoint key %v", e.key)
		}
	}
	if !slices.Equal(eps[1].val, []byte{10, 0, 2, 2, 0x1f, 0x90, 0, 0}) {
		t.Errorf("endpoint value %v", eps[1].val)
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
}

func TestRenderNoEndpoints(t *testing.T) {
	r := testRenderer(t, model.IPv4, false)
	s := clusterSvc("empty", model.UDP, "10.96.0.2", 53)
	s.sp.NodePort = 30053
	s.sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
	o, err := r.service(s.sp.Name, s.sp, s.t, 1, nil)
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
		if e.verdict.code != unix.NFT_GOTO || e.verdict.chain != chainReject {
			t.Errorf("verdict %+v, want goto reject", e.verdict)
		}
	}
}

func TestRenderPolicies(t *testing.T) {
	r := testRenderer(t, model.IPv4, true)
	// Internal Local without local endpoints, external Cluster: cluster IP
	// dropped, node port balanced with masquerade.
	s := clusterSvc("mixed", model.TCP, "10.96.0.3", 80)
	s.sp.NodePort = 30080
	s.sp.InternalPolicy = model.PolicyLocal
	s.t = &proxier.Targets{HasEndpoints: true, External: eps("10.0.1.2:8080")}
	o, err := r.service(s.sp.Name, s.sp, s.t, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"ext-default/mixed/tcp"}) {
		t.Fatalf("chains %v", got)
	}
	if d := elemsOf(o, setNoEndpointIPs); len(d) != 1 || d[0].verdict.code != nfDrop {
		t.Fatalf("cluster IP: %+v, want drop", d)
	}
	if !slices.Equal(o.chains[0].enc[0], r.mark) {
		t.Errorf("external chain does not start by marking for masquerade")
	}

	// External Local without local endpoints: node port dropped.
	s = clusterSvc("local", model.TCP, "10.96.0.4", 80, "10.0.2.2:8080")
	s.sp.NodePort = 30081
	s.sp.ExternalPolicy = model.PolicyLocal
	s.t.External = nil
	o, err = r.service(s.sp.Name, s.sp, s.t, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := elemsOf(o, setNoEndpointPorts); len(d) != 1 || d[0].verdict.code != nfDrop {
		t.Fatalf("node port: %+v, want drop", d)
	}
	if got := chainNamesOf(o); !slices.Equal(got, []string{"svc-default/local/tcp"}) {
		t.Fatalf("chains %v", got)
	}
	// The cluster chain masquerades traffic from outside the cluster.
	if !slices.Equal(o.chains[0].enc[0], r.jumpMasq) {
		t.Errorf("cluster chain does not jump to %s", chainMasqCluster)
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	r := testRenderer(t, model.IPv4, false)
	s := clusterSvc("v6", model.TCP, "fd00::1", 80, "10.0.1.2:80")
	if _, err := r.service(s.sp.Name, s.sp, s.t, 1, nil); err == nil {
		t.Error("IPv6 cluster IP in an IPv4 backend accepted")
	}
	s = clusterSvc("bad", "ICMP", "10.96.0.1", 80)
	if _, err := r.service(s.sp.Name, s.sp, s.t, 1, nil); err == nil {
		t.Error("bad protocol accepted")
	}
	s = clusterSvc(strings.Repeat("x", 300), model.TCP, "10.96.0.1", 80)
	if _, err := r.service(s.sp.Name, s.sp, s.t, 1, nil); err == nil {
		t.Error("over-long name accepted")
	}
}

func TestStableSlots(t *testing.T) {
	a, b, c, d := ap("10.0.0.1:1"), ap("10.0.0.2:1"), ap("10.0.0.3:1"), ap("10.0.0.4:1")
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
		{"replace", []netip.AddrPort{a, b, c}, []netip.AddrPort{a, d, c}, []netip.AddrPort{a, c, d}},
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
	if len(els) != 1 || els[0].intervalEnd {
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
func messages(tx *batch) []string {
	var out []string
	for _, l := range tx.labels {
		s := l.what
		if l.svc != nil {
			s = l.svc.String() + ": " + s
		}
		out = append(out, s)
	}
	return out
}

func TestIncrementalTouchesOnlyChanged(t *testing.T) {
	b := offlineBackend(t)
	svcs := scaleServices(50, 3)
	st, errs := b.buildFull(request(model.IPv4, svcs, nil), true, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.st = st

	// One endpoint added to one service.
	changed := svcs[7]
	grown := testSvc{sp: changed.sp, t: &proxier.Targets{HasEndpoints: true,
		Internal: append(append([]*model.Endpoint{}, changed.t.Internal...), ep("10.200.0.1:8080"))}}
	grown.t.External = grown.t.Internal
	svcs[7] = grown
	d, tx, errs, err := b.buildIncremental(request(model.IPv4, svcs, names(grown)), map[model.ServicePortName]error{})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	msgs := messages(tx)
	name := changed.sp.Name.String()
	for _, m := range msgs {
		if !strings.HasPrefix(m, name+": ") && !strings.Contains(m, setHairpin) {
			t.Errorf("message for something else: %q", m)
		}
	}
	// The service's rule is replaced (its modulus changed); one endpoint
	// element and one hairpin element are added. Nothing else.
	want := []string{
		name + ": flush chain svc-default/svc-00007/tcp/http",
		name + ": add rule to chain svc-default/svc-00007/tcp/http",
		name + ": add elements to " + endpointsMap(shardOf(st.services[changed.sp.Name].id*2)),
		"add elements to hairpin",
	}
	if !slices.Equal(msgs, want) {
		t.Errorf("messages:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	d.apply()

	// Deleting a service removes its chain after its dispatch element.
	svcs = slices.Delete(svcs, 7, 8)
	_, tx, _, err = b.buildIncremental(request(model.IPv4, svcs, names(grown)), map[model.ServicePortName]error{})
	if err != nil {
		t.Fatal(err)
	}
	msgs = messages(tx)
	iDel := slices.Index(msgs, name+": delete chain svc-default/svc-00007/tcp/http")
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
	if len(st.services) != 1 || errs[dup.sp.Name] == nil {
		t.Fatalf("services %d, errors %v: want b reported", len(st.services), errs)
	}
	err := joinObjectErrors(errs)
	var oe *proxier.ObjectError
	if !errorsAs(err, &oe) || oe.Service != dup.sp.Name {
		t.Fatalf("error %v is not an ObjectError for b", err)
	}
}

func TestBatchSplitsElements(t *testing.T) {
	tx := newBatch(unix.NFPROTO_IPV4, "t")
	var els []elem
	for i := range 20000 {
		els = append(els, elem{key: endpointKey(2, uint32(i)), val: []byte{10, 0, 0, 1, 0, 80, 0, 0}})
	}
	tx.addElems(endpointsMap(0), els)
	if tx.err != nil {
		t.Fatal(tx.err)
	}
	if tx.Len() < 10 {
		t.Fatalf("%d messages for 20000 elements", tx.Len())
	}
	// Walk the messages: lengths must add up.
	n := 0
	for off := 0; off < len(tx.buf); n++ {
		l := int(binary.NativeEndian.Uint32(tx.buf[off:]))
		if l < nlmsgHdrLen || l > 64<<10 {
			t.Fatalf("message %d of %d bytes", n, l)
		}
		off += align4(l)
	}
	if n != tx.Len()+1 { // plus BATCH_BEGIN
		t.Fatalf("walked %d messages, want %d", n, tx.Len()+1)
	}
}
