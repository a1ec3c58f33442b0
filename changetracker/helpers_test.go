package changetracker

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/model"
)

func ptr[T any](v T) *T { return &v }

// cmpOpts compare the netip types by value.
var cmpOpts = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

// testLogger sends the tracker's logs to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

func newTracker(t testing.TB, fam model.IPFamily) *Tracker {
	return New(Config{Family: fam, NodeName: "node1", Logger: testLogger(t)})
}

// svc builds a ClusterIP Service ns/name with cluster IP 10.0.0.1 and one
// unnamed TCP port 80, then applies the options.
func svc(name string, opts ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.0.0.1",
			ClusterIPs: []string{"10.0.0.1"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func clusterIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		s.Spec.IPFamilies = nil
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func ports(ps ...v1.ServicePort) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports = ps }
}

func svcType(ty v1.ServiceType) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Type = ty }
}

func labels(kv ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Labels = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			s.Labels[kv[i]] = kv[i+1]
		}
	}
}

func with(f func(*v1.ServiceSpec)) func(*v1.Service) {
	return func(s *v1.Service) { f(&s.Spec) }
}

func lbIngress(ing ...v1.LoadBalancerIngress) func(*v1.Service) {
	return func(s *v1.Service) { s.Status.LoadBalancer.Ingress = ing }
}

func spn(svc, port string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: svc}, Port: port, Protocol: proto}
}

// sp returns the ServicePort the default svc() produces for port p,
// before the modifications a test applies.
func sp(name model.ServicePortName, port uint16, mods ...func(*model.ServicePort)) *model.ServicePort {
	p := &model.ServicePort{
		Name:           name,
		ClusterIP:      netip.MustParseAddr("10.0.0.1"),
		Port:           port,
		Protocol:       name.Protocol,
		ExternalPolicy: model.PolicyCluster,
		InternalPolicy: model.PolicyCluster,
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func affinity(d time.Duration) func(*model.ServicePort) {
	return func(p *model.ServicePort) { p.SessionAffinity, p.AffinityTimeout = true, d }
}

// slice builds an IPv4 EndpointSlice ns/name of Service svcName.
func slice(name, svcName string, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svcName},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ps,
		Endpoints:   eps,
	}
	if svcName == "" {
		s.Labels = nil
	}
	return s
}

func v6(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	s.AddressType = discoveryv1.AddressTypeIPv6
	return s
}

func eport(name string, proto v1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

// ep builds a ready endpoint; conds, when given, are ready, serving and
// terminating, each nil or a bool.
func ep(addr string, conds ...*bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	if len(conds) > 0 {
		e.Conditions = discoveryv1.EndpointConditions{Ready: conds[0], Serving: conds[1], Terminating: conds[2]}
	}
	return e
}

var (
	tru = ptr(true)
	fls = ptr(false)
)

func onNode(node string, e discoveryv1.Endpoint) discoveryv1.Endpoint {
	e.NodeName = ptr(node)
	return e
}

// mep builds the model endpoint of ep(addr) on port.
func mep(addrPort string, mods ...func(*model.Endpoint)) *model.Endpoint {
	e := &model.Endpoint{Addr: netip.MustParseAddrPort(addrPort), Ready: true, Serving: true}
	for _, m := range mods {
		m(e)
	}
	return e
}

func notReady(e *model.Endpoint)                  { e.Ready = false }
func notServing(e *model.Endpoint)                { e.Ready, e.Serving = false, false }
func terminatingServing(e *model.Endpoint)        { e.Ready, e.Serving, e.Terminating = false, true, true }
func local(e *model.Endpoint)                     { e.NodeName, e.Local = "node1", true }
func node(n string) func(*model.Endpoint)         { return func(e *model.Endpoint) { e.NodeName = n } }
func zone(z string) func(*model.Endpoint)         { return func(e *model.Endpoint) { e.Zone = z } }
func zoneHints(z ...string) func(*model.Endpoint) { return func(e *model.Endpoint) { e.ZoneHints = z } }
func nodeHints(n ...string) func(*model.Endpoint) { return func(e *model.Endpoint) { e.NodeHints = n } }
func changed(names ...model.ServicePortName) map[model.ServicePortName]struct{} {
	m := make(map[model.ServicePortName]struct{})
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}
