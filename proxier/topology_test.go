package proxier

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/proxykit/proxykit/model"
)

func ep(addr string, opts ...func(*model.Endpoint)) *model.Endpoint {
	e := &model.Endpoint{Addr: netip.MustParseAddrPort(addr), Ready: true, Serving: true}
	for _, o := range opts {
		o(e)
	}
	return e
}

func local(e *model.Endpoint)       { e.Local = true; e.NodeName = "n1" }
func notReady(e *model.Endpoint)    { e.Ready, e.Serving = false, false }
func terminating(e *model.Endpoint) { e.Ready, e.Terminating = false, true }
func zone(z string) func(*model.Endpoint) {
	return func(e *model.Endpoint) { e.Zone = z }
}
func zoneHints(z ...string) func(*model.Endpoint) {
	return func(e *model.Endpoint) { e.ZoneHints = z }
}
func nodeHints(n ...string) func(*model.Endpoint) {
	return func(e *model.Endpoint) { e.NodeHints = n }
}

func addrs(eps []*model.Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, e.Addr.String())
	}
	return out
}

func TestSelectTargets(t *testing.T) {
	topo := Topology{NodeName: "n1", Zone: "a"}
	clusterIP := &model.ServicePort{Port: 80}
	nodePort := &model.ServicePort{Port: 80, NodePort: 30080}
	etpLocal := &model.ServicePort{Port: 80, NodePort: 30080, ExternalPolicy: model.PolicyLocal}
	itpLocal := &model.ServicePort{Port: 80, InternalPolicy: model.PolicyLocal}
	sameZone := &model.ServicePort{Port: 80, TrafficDistribution: model.PreferSameZone}
	sameNode := &model.ServicePort{Port: 80, TrafficDistribution: model.PreferSameNode}

	for _, tc := range []struct {
		name         string
		sp           *model.ServicePort
		eps          []*model.Endpoint
		internal     []string
		external     []string
		hasEndpoints bool
	}{
		{"no endpoints", clusterIP, nil, []string{}, []string{}, false},
		{"ready only", clusterIP, []*model.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80", notReady)}, []string{"10.0.0.1:80"}, []string{}, true},
		{"only not ready", clusterIP, []*model.Endpoint{ep("10.0.0.2:80", notReady)}, []string{}, []string{}, false},
		{"terminating fallback", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", terminating), ep("10.0.0.2:80", notReady)}, []string{"10.0.0.1:80"}, []string{}, true},
		{"terminating unused while ready exist", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", terminating), ep("10.0.0.2:80")}, []string{"10.0.0.2:80"}, []string{}, true},
		{"node port uses cluster endpoints", nodePort, []*model.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80", local)}, []string{"10.0.0.1:80", "10.0.0.2:80"}, []string{"10.0.0.1:80", "10.0.0.2:80"}, true},
		{"etp local", etpLocal, []*model.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80", local)}, []string{"10.0.0.1:80", "10.0.0.2:80"}, []string{"10.0.0.2:80"}, true},
		{"etp local without local endpoints drops", etpLocal, []*model.Endpoint{ep("10.0.0.1:80")}, []string{"10.0.0.1:80"}, []string{}, true},
		{"etp local terminating local fallback", etpLocal, []*model.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80", local, terminating)}, []string{"10.0.0.1:80"}, []string{"10.0.0.2:80"}, true},
		{"itp local", itpLocal, []*model.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80", local)}, []string{"10.0.0.2:80"}, []string{}, true},
		{"itp local none local", itpLocal, []*model.Endpoint{ep("10.0.0.1:80")}, []string{}, []string{}, true},
		{"zone hints", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", zoneHints("a")), ep("10.0.0.2:80", zoneHints("b"))}, []string{"10.0.0.1:80"}, []string{}, true},
		{"zone hints not for us", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", zoneHints("c")), ep("10.0.0.2:80", zoneHints("b"))}, []string{"10.0.0.1:80", "10.0.0.2:80"}, []string{}, true},
		{"incomplete hints ignored", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", zoneHints("a")), ep("10.0.0.2:80")}, []string{"10.0.0.1:80", "10.0.0.2:80"}, []string{}, true},
		{"node hints", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", nodeHints("n2"), zoneHints("a")), ep("10.0.0.2:80", nodeHints("n1"), zoneHints("a"))}, []string{"10.0.0.2:80"}, []string{}, true},
		{"prefer same zone without hints", sameZone, []*model.Endpoint{ep("10.0.0.1:80", zone("a")), ep("10.0.0.2:80", zone("b"))}, []string{"10.0.0.1:80"}, []string{}, true},
		{"prefer same zone, none in zone", sameZone, []*model.Endpoint{ep("10.0.0.1:80", zone("c")), ep("10.0.0.2:80", zone("b"))}, []string{"10.0.0.1:80", "10.0.0.2:80"}, []string{}, true},
		{"prefer same node without hints", sameNode, []*model.Endpoint{ep("10.0.0.1:80", zone("a")), ep("10.0.0.2:80", local)}, []string{"10.0.0.2:80"}, []string{}, true},
		{"topology ignores not-ready", clusterIP, []*model.Endpoint{ep("10.0.0.1:80", zoneHints("a")), ep("10.0.0.2:80", zoneHints("b")), ep("10.0.0.3:80", notReady)}, []string{"10.0.0.1:80"}, []string{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SelectTargets(tc.sp, tc.eps, topo)
			if g := addrs(got.Internal); !equal(g, tc.internal) {
				t.Errorf("internal = %v, want %v", g, tc.internal)
			}
			if g := addrs(got.External); !equal(g, tc.external) {
				t.Errorf("external = %v, want %v", g, tc.external)
			}
			if got.HasEndpoints != tc.hasEndpoints {
				t.Errorf("HasEndpoints = %v, want %v", got.HasEndpoints, tc.hasEndpoints)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPrimaryNodeIP(t *testing.T) {
	a := netip.MustParseAddr
	req := &SyncRequest{NodeIPs: []netip.Addr{a("fd00::5"), a("192.0.2.5"), a("192.0.2.6")}}
	for _, tc := range []struct {
		cfg  Config
		req  *SyncRequest
		f    model.IPFamily
		want string
	}{
		{Config{}, req, model.IPv4, "192.0.2.5"},
		{Config{}, req, model.IPv6, "fd00::5"},
		{Config{NodeIPs: []netip.Addr{a("198.51.100.1")}}, req, model.IPv4, "198.51.100.1"},
		{Config{NodeIPs: []netip.Addr{a("198.51.100.1")}}, req, model.IPv6, "fd00::5"},
		{Config{}, nil, model.IPv4, "invalid IP"},
	} {
		if got := PrimaryNodeIP(tc.cfg, tc.req, tc.f); got.String() != tc.want {
			t.Errorf("PrimaryNodeIP(%v, %v, %v) = %v, want %s", tc.cfg.NodeIPs, tc.req, tc.f, got, tc.want)
		}
	}
}

// TestSelectTargetsShortCircuit: with both traffic policies Local, pods and
// the node reach the external addresses through the cluster-wide
// endpoints (Targets.Cluster), as kube-proxy's short-circuit does; with
// internalTrafficPolicy Cluster, Internal serves it (Cluster nil).
func TestSelectTargetsShortCircuit(t *testing.T) {
	topo := Topology{NodeName: "n1"}
	both := &model.ServicePort{Port: 80, NodePort: 30080, ExternalPolicy: model.PolicyLocal, InternalPolicy: model.PolicyLocal}
	remote, near := ep("10.0.0.1:80"), ep("10.0.0.2:80", local)
	tg := SelectTargets(both, []*model.Endpoint{remote, near}, topo)
	if !slices.Equal(tg.Internal, []*model.Endpoint{near}) || !slices.Equal(tg.External, []*model.Endpoint{near}) ||
		!slices.Equal(tg.Cluster, []*model.Endpoint{remote, near}) || !slices.Equal(tg.ShortCircuit(), tg.Cluster) {
		t.Errorf("both Local: internal %v external %v cluster %v", tg.Internal, tg.External, tg.Cluster)
	}
	tg = SelectTargets(both, []*model.Endpoint{remote}, topo)
	if len(tg.Internal) != 0 || len(tg.External) != 0 || !slices.Equal(tg.Cluster, []*model.Endpoint{remote}) || !tg.HasEndpoints {
		t.Errorf("both Local, remote only: %+v", tg)
	}
	etp := &model.ServicePort{Port: 80, NodePort: 30080, ExternalPolicy: model.PolicyLocal}
	tg = SelectTargets(etp, []*model.Endpoint{remote, near}, topo)
	if tg.Cluster != nil || !slices.Equal(tg.ShortCircuit(), tg.Internal) {
		t.Errorf("external Local only: cluster %v, want nil", tg.Cluster)
	}
}

// TestExternalReplies: the conntrack cleanup keeps the flows of pods and
// the node to a Local service's external addresses, which the
// short-circuit endpoints answer (remote ones too), not only the flows the
// local endpoints answer.
func TestExternalReplies(t *testing.T) {
	remote, near := ep("10.0.0.1:80"), ep("10.0.0.2:80", local)
	etp := &model.ServicePort{Port: 80, NodePort: 30080, ExternalPolicy: model.PolicyLocal, Protocol: model.UDP}
	tg := SelectTargets(etp, []*model.Endpoint{remote, near}, Topology{NodeName: "n1"})
	if got := externalReplies(etp, tg); !slices.Contains(got, remote) || !slices.Contains(got, near) {
		t.Errorf("Local: %v, want both endpoints", got)
	}
	cl := &model.ServicePort{Port: 80, NodePort: 30080, Protocol: model.UDP}
	tg = SelectTargets(cl, []*model.Endpoint{remote, near}, Topology{NodeName: "n1"})
	if got := externalReplies(cl, tg); !slices.Equal(got, tg.External) {
		t.Errorf("Cluster: %v, want the external targets", got)
	}
}
