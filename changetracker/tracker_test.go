package changetracker

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

type event func(*Tracker)

func add(s *v1.Service) event                { return func(t *Tracker) { t.OnService(nil, s) } }
func upd(o, n *v1.Service) event             { return func(t *Tracker) { t.OnService(o, n) } }
func del(s *v1.Service) event                { return func(t *Tracker) { t.OnService(s, nil) } }
func put(s *discoveryv1.EndpointSlice) event { return func(t *Tracker) { t.OnEndpointSlice(s, false) } }
func drop(s *discoveryv1.EndpointSlice) event {
	return func(t *Tracker) { t.OnEndpointSlice(s, true) }
}

var (
	httpPorts = []discoveryv1.EndpointPort{eport("http", v1.ProtocolTCP, 8080)}
	dnsPorts  = []discoveryv1.EndpointPort{eport("dns", v1.ProtocolUDP, 5353)}
)

func TestMerge(t *testing.T) {
	var (
		a       = svc("a")
		a2      = svc("a", clusterIPs("10.0.0.2"))
		a3      = svc("a", clusterIPs("10.0.0.3"))
		aLabel  = svc("a", labels("app", "x")) // same ports as a
		aTwo    = svc("a", ports(v1.ServicePort{Name: "x", Port: 1}, v1.ServicePort{Name: "y", Port: 2}))
		aTwoMod = svc("a", ports(v1.ServicePort{Name: "x", Port: 1}, v1.ServicePort{Name: "y", Port: 3}))
		b       = svc("b")
		s1      = slice("s1", "a", httpPorts, ep("10.1.0.1"))
		s1b     = slice("s1", "a", httpPorts, ep("10.1.0.2"))
		s1toB   = slice("s1", "b", httpPorts, ep("10.1.0.1"))
		s1v6    = v6(slice("s1", "a", httpPorts, ep("fd01::1")))
		s1noLbl = slice("s1", "", httpPorts, ep("10.1.0.1"))
		s2dup   = slice("s2", "a", httpPorts, ep("10.1.0.1"))
		tcpA    = spn("a", "", model.TCP)
		httpA   = spn("a", "http", model.TCP)
		httpB   = spn("b", "http", model.TCP)
	)
	tests := []struct {
		name        string
		before      []event // applied first
		events      []event
		wantPending bool
		wantChanged []model.ServicePortName
		wantSvcs    map[model.ServicePortName]*model.ServicePort // nil: not checked
		wantEps     map[model.ServicePortName][]*model.Endpoint  // nil: not checked
	}{{
		name:        "add",
		events:      []event{add(a)},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA},
		wantSvcs:    map[model.ServicePortName]*model.ServicePort{tcpA: sp(tcpA, 80)},
	}, {
		name:     "add then delete cancels",
		events:   []event{add(a), del(a)},
		wantSvcs: map[model.ServicePortName]*model.ServicePort{},
	}, {
		name:   "delete of an unknown service is nothing",
		events: []event{del(a)},
	}, {
		name:        "update chain keeps the latest",
		before:      []event{add(a)},
		events:      []event{upd(a, a2), upd(a2, a3)},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA},
		wantSvcs: map[model.ServicePortName]*model.ServicePort{tcpA: sp(tcpA, 80, func(p *model.ServicePort) {
			p.ClusterIP = netip.MustParseAddr("10.0.0.3")
		})},
	}, {
		name:   "update chain back to the start is dropped",
		before: []event{add(a)},
		events: []event{upd(a, a2), upd(a2, a)},
	}, {
		name:   "update that changes nothing we track is dropped",
		before: []event{add(a)},
		events: []event{upd(a, aLabel)},
	}, {
		name:        "update then delete is a delete",
		before:      []event{add(a)},
		events:      []event{upd(a, a2), del(a2)},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA},
		wantSvcs:    map[model.ServicePortName]*model.ServicePort{},
	}, {
		name:        "delete then add back something else",
		before:      []event{add(a)},
		events:      []event{del(a), add(a2)},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA},
	}, {
		name:   "delete then add back the same",
		before: []event{add(a)},
		events: []event{del(a), add(a)},
	}, {
		name:        "only the changed port is listed",
		before:      []event{add(aTwo)},
		events:      []event{upd(aTwo, aTwoMod)},
		wantPending: true,
		wantChanged: []model.ServicePortName{spn("a", "y", model.TCP)},
	}, {
		name:        "an update that renames is a delete and an add",
		before:      []event{add(a)},
		events:      []event{upd(a, b)},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA, spn("b", "", model.TCP)},
	}, {
		name:        "becoming headless removes the service",
		before:      []event{add(a)},
		events:      []event{upd(a, svc("a", clusterIPs("None")))},
		wantPending: true,
		wantChanged: []model.ServicePortName{tcpA},
		wantSvcs:    map[model.ServicePortName]*model.ServicePort{},
	}, {
		name:     "slice add then delete cancels",
		events:   []event{put(s1), drop(s1)},
		wantEps:  map[model.ServicePortName][]*model.Endpoint{},
		wantSvcs: map[model.ServicePortName]*model.ServicePort{},
	}, {
		name:   "slice update to the same content is dropped",
		before: []event{put(s1)},
		events: []event{put(slice("s1", "a", httpPorts, ep("10.1.0.1")))},
	}, {
		name:   "slice update and back is dropped",
		before: []event{put(s1)},
		events: []event{put(s1b), put(s1)},
	}, {
		name:        "slice update chain",
		before:      []event{put(s1)},
		events:      []event{put(slice("s1", "a", httpPorts, ep("10.1.0.7"))), put(s1b)},
		wantPending: true,
		wantChanged: []model.ServicePortName{httpA},
		wantEps:     map[model.ServicePortName][]*model.Endpoint{httpA: {mep("10.1.0.2:8080")}},
	}, {
		name:   "slice delete of an unknown slice is nothing",
		events: []event{drop(s1)},
	}, {
		name:        "slice moving to another service leaves the first",
		before:      []event{put(s1)},
		events:      []event{put(s1toB)},
		wantPending: true,
		wantChanged: []model.ServicePortName{httpA, httpB},
		wantEps:     map[model.ServicePortName][]*model.Endpoint{httpB: {mep("10.1.0.1:8080")}},
	}, {
		name:        "slice changing family leaves",
		before:      []event{put(s1)},
		events:      []event{put(s1v6)},
		wantPending: true,
		wantChanged: []model.ServicePortName{httpA},
		wantEps:     map[model.ServicePortName][]*model.Endpoint{},
	}, {
		name:        "slice losing its label leaves",
		before:      []event{put(s1)},
		events:      []event{put(s1noLbl)},
		wantPending: true,
		wantChanged: []model.ServicePortName{httpA},
		wantEps:     map[model.ServicePortName][]*model.Endpoint{},
	}, {
		name:        "a slice change that the merge hides is not listed",
		before:      []event{put(s1)},
		events:      []event{put(s2dup)}, // same endpoint in a second slice
		wantPending: true,
		wantEps:     map[model.ServicePortName][]*model.Endpoint{httpA: {mep("10.1.0.1:8080")}},
	}, {
		name:        "deleting one of two slices with the same endpoint",
		before:      []event{put(s1), put(s2dup)},
		events:      []event{drop(s1)},
		wantPending: true,
		wantEps:     map[model.ServicePortName][]*model.Endpoint{httpA: {mep("10.1.0.1:8080")}},
	}, {
		name:        "endpoints without a service",
		events:      []event{put(s1)},
		wantPending: true,
		wantChanged: []model.ServicePortName{httpA},
		wantSvcs:    map[model.ServicePortName]*model.ServicePort{},
		wantEps:     map[model.ServicePortName][]*model.Endpoint{httpA: {mep("10.1.0.1:8080")}},
	}, {
		name:        "nil events are ignored",
		events:      []event{func(t *Tracker) { t.OnService(nil, nil); t.OnEndpointSlice(nil, false) }},
		wantPending: false,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTracker(t, model.IPv4)
			for _, e := range tt.before {
				e(tr)
			}
			tr.Apply()
			for _, e := range tt.events {
				e(tr)
			}
			if got := tr.Pending(); got != tt.wantPending {
				t.Errorf("Pending() = %v, want %v", got, tt.wantPending)
			}
			res := tr.Apply()
			if diff := cmp.Diff(changed(tt.wantChanged...), res.Changed); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			if tr.Pending() {
				t.Error("pending after Apply")
			}
			if tt.wantSvcs != nil {
				if diff := cmp.Diff(tt.wantSvcs, tr.State().Services, cmpOpts); diff != "" {
					t.Errorf("services (-want +got):\n%s", diff)
				}
			}
			if tt.wantEps != nil {
				if diff := cmp.Diff(tt.wantEps, tr.State().Endpoints, cmpOpts); diff != "" {
					t.Errorf("endpoints (-want +got):\n%s", diff)
				}
			}
			if res := tr.Apply(); len(res.Changed) != 0 || len(res.StaleEndpoints) != 0 || len(res.StaleServices) != 0 {
				t.Errorf("second Apply: %v", res)
			}
		})
	}
}

// TestPointersKept checks that unchanged values keep their published
// pointers and that published values are never modified.
func TestPointersKept(t *testing.T) {
	tr := newTracker(t, model.IPv4)
	two := svc("a", ports(v1.ServicePort{Name: "x", Port: 1}, v1.ServicePort{Name: "y", Port: 2}))
	tr.OnService(nil, two)
	tr.OnEndpointSlice(slice("s1", "a", httpPorts, ep("10.1.0.1"), ep("10.1.0.2"), ep("10.1.0.3")), false)
	tr.Apply()
	st := tr.State()
	x, y := st.Services[spn("a", "x", model.TCP)], st.Services[spn("a", "y", model.TCP)]
	httpA := spn("a", "http", model.TCP)
	eps := st.Endpoints[httpA]
	epsCopy := append([]*model.Endpoint(nil), eps...)
	val2 := *eps[1]

	tr.OnService(two, svc("a", ports(v1.ServicePort{Name: "x", Port: 1}, v1.ServicePort{Name: "y", Port: 3})))
	tr.OnEndpointSlice(slice("s1", "a", httpPorts, ep("10.1.0.1"), ep("10.1.0.2", fls, nil, nil), ep("10.1.0.3")), false)
	tr.Apply()

	if st.Services[spn("a", "x", model.TCP)] != x {
		t.Error("unchanged port x got a new pointer")
	}
	if st.Services[spn("a", "y", model.TCP)] == y || y.Port != 2 {
		t.Errorf("changed port y: pointer kept or old value modified (port %d)", y.Port)
	}
	now := st.Endpoints[httpA]
	if now[0] != eps[0] || now[2] != eps[2] {
		t.Error("unchanged endpoints got new pointers")
	}
	if now[1] == eps[1] || !cmp.Equal(*eps[1], val2, cmpOpts) || !slicesEqualPtr(eps, epsCopy) {
		t.Error("changed endpoint: pointer kept or the old list was modified")
	}
}

func TestStale(t *testing.T) {
	var (
		dnsA     = spn("a", "dns", model.UDP)
		sctpA    = spn("a", "sig", model.SCTP)
		httpA    = spn("a", "http", model.TCP)
		sigPorts = []discoveryv1.EndpointPort{eport("sig", v1.ProtocolSCTP, 3868)}
		udpSvc   = svc("a", ports(v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}))
		tcpSvc   = svc("a", ports(v1.ServicePort{Name: "http", Port: 80}))
		stale    = func(n model.ServicePortName, ap string) StaleEndpoint {
			return StaleEndpoint{Service: n, Endpoint: netip.MustParseAddrPort(ap)}
		}
	)
	tests := []struct {
		name       string
		before     []event
		events     []event
		wantEps    []StaleEndpoint
		wantSvcs   []model.ServicePortName
		wantOldSvc []model.ServicePortName
	}{{
		name:     "UDP endpoints appear: newly active service",
		events:   []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1")))},
		wantSvcs: []model.ServicePortName{dnsA},
	}, {
		name:     "SCTP endpoints appear",
		events:   []event{put(slice("s1", "a", sigPorts, ep("10.1.0.1")))},
		wantSvcs: []model.ServicePortName{sctpA},
	}, {
		name:   "TCP endpoints appear: nothing",
		events: []event{put(slice("s1", "a", httpPorts, ep("10.1.0.1")))},
	}, {
		name:     "UDP from only non-serving to serving",
		before:   []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1", fls, fls, nil)))},
		events:   []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1")))},
		wantSvcs: []model.ServicePortName{dnsA},
	}, {
		name:   "UDP gaining a second endpoint: nothing",
		before: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1")))},
		events: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
	}, {
		name:    "UDP endpoint removed",
		before:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
		events:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.2")))},
		wantEps: []StaleEndpoint{stale(dnsA, "10.1.0.1:5353")},
	}, {
		name:    "UDP endpoint stops serving",
		before:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
		events:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1", fls, fls, tru), ep("10.1.0.2")))},
		wantEps: []StaleEndpoint{stale(dnsA, "10.1.0.1:5353")},
	}, {
		name:   "UDP endpoint terminating but still serving: nothing",
		before: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
		events: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1", fls, tru, tru), ep("10.1.0.2")))},
	}, {
		name:   "UDP non-serving endpoint removed: nothing",
		before: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1", fls, fls, nil), ep("10.1.0.2")))},
		events: []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.2")))},
	}, {
		name:    "UDP target port changed",
		before:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.1")))},
		events:  []event{put(slice("s1", "a", []discoveryv1.EndpointPort{eport("dns", v1.ProtocolUDP, 53)}, ep("10.1.0.1")))},
		wantEps: []StaleEndpoint{stale(dnsA, "10.1.0.1:5353")},
	}, {
		name:    "UDP slice deleted",
		before:  []event{put(slice("s1", "a", dnsPorts, ep("10.1.0.2"), ep("10.1.0.1")))},
		events:  []event{drop(slice("s1", "a", nil))},
		wantEps: []StaleEndpoint{stale(dnsA, "10.1.0.1:5353"), stale(dnsA, "10.1.0.2:5353")},
	}, {
		name:    "SCTP endpoint removed",
		before:  []event{put(slice("s1", "a", sigPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
		events:  []event{put(slice("s1", "a", sigPorts, ep("10.1.0.2")))},
		wantEps: []StaleEndpoint{stale(sctpA, "10.1.0.1:3868")},
	}, {
		name:   "TCP endpoint removed: nothing",
		before: []event{put(slice("s1", "a", httpPorts, ep("10.1.0.1"), ep("10.1.0.2")))},
		events: []event{put(slice("s1", "a", httpPorts, ep("10.1.0.2")))},
	}, {
		name:       "UDP service deleted",
		before:     []event{add(udpSvc)},
		events:     []event{del(udpSvc)},
		wantSvcs:   []model.ServicePortName{dnsA},
		wantOldSvc: []model.ServicePortName{dnsA},
	}, {
		name:       "TCP service deleted: old value only",
		before:     []event{add(tcpSvc)},
		events:     []event{del(tcpSvc)},
		wantOldSvc: []model.ServicePortName{httpA},
	}, {
		name:       "UDP service changed: old value, not stale",
		before:     []event{add(udpSvc)},
		events:     []event{upd(udpSvc, svc("a", clusterIPs("10.0.0.9"), ports(udpSvc.Spec.Ports...)))},
		wantOldSvc: []model.ServicePortName{dnsA},
	}, {
		name:       "UDP service deleted and endpoints appear together: listed once",
		before:     []event{add(udpSvc)},
		events:     []event{del(udpSvc), put(slice("s1", "a", dnsPorts, ep("10.1.0.1")))},
		wantSvcs:   []model.ServicePortName{dnsA},
		wantOldSvc: []model.ServicePortName{dnsA},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTracker(t, model.IPv4)
			for _, e := range tt.before {
				e(tr)
			}
			tr.Apply()
			old := make(map[model.ServicePortName]*model.ServicePort)
			for k, v := range tr.State().Services {
				old[k] = v
			}
			for _, e := range tt.events {
				e(tr)
			}
			res := tr.Apply()
			if diff := cmp.Diff(tt.wantEps, res.StaleEndpoints, cmpOpts); diff != "" {
				t.Errorf("stale endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantSvcs, res.StaleServices); diff != "" {
				t.Errorf("stale services (-want +got):\n%s", diff)
			}
			wantOld := make(map[model.ServicePortName]*model.ServicePort)
			for _, n := range tt.wantOldSvc {
				wantOld[n] = old[n]
			}
			if diff := cmp.Diff(wantOld, res.OldServices, cmpOpts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("old services (-want +got):\n%s", diff)
			}
			for n, p := range res.OldServices {
				if old[n] != p {
					t.Errorf("OldServices[%v] is not the published pointer", n)
				}
			}
		})
	}
}

func TestDualFamilySplit(t *testing.T) {
	v4 := newTracker(t, model.IPv4)
	v6t := newTracker(t, model.IPv6)
	dual := svc("a",
		clusterIPs("10.0.0.1", "fd00::1"),
		svcType(v1.ServiceTypeLoadBalancer),
		ports(v1.ServicePort{Name: "http", Port: 80, NodePort: 30080}),
		with(func(s *v1.ServiceSpec) {
			s.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
			s.LoadBalancerSourceRanges = []string{"1.2.3.0/24", "2001:db8:1::/48"}
		}),
		lbIngress(v1.LoadBalancerIngress{IP: "5.6.7.8"}, v1.LoadBalancerIngress{IP: "2001:db8::5"}))
	s4 := slice("a-v4", "a", httpPorts, ep("10.1.0.1"))
	s6 := v6(slice("a-v6", "a", httpPorts, ep("fd01::1")))
	for _, tr := range []*Tracker{v4, v6t} {
		tr.OnService(nil, dual)
		tr.OnEndpointSlice(s4, false)
		tr.OnEndpointSlice(s6, false)
		tr.Apply()
	}
	httpA := spn("a", "http", model.TCP)
	base := func(p *model.ServicePort) { p.NodePort = 30080 }
	want4 := sp(httpA, 80, base, func(p *model.ServicePort) {
		p.ExternalIPs = addrs("192.0.2.1")
		p.LoadBalancerIPs = addrs("5.6.7.8")
		p.LoadBalancerSourceRanges = prefixes("1.2.3.0/24")
	})
	want6 := sp(httpA, 80, base, func(p *model.ServicePort) {
		p.ClusterIP = netip.MustParseAddr("fd00::1")
		p.ExternalIPs = addrs("2001:db8::1")
		p.LoadBalancerIPs = addrs("2001:db8::5")
		p.LoadBalancerSourceRanges = prefixes("2001:db8:1::/48")
	})
	for _, c := range []struct {
		tr  *Tracker
		fam model.IPFamily
		svc *model.ServicePort
		eps []*model.Endpoint
	}{
		{v4, model.IPv4, want4, []*model.Endpoint{mep("10.1.0.1:8080")}},
		{v6t, model.IPv6, want6, []*model.Endpoint{mep("[fd01::1]:8080")}},
	} {
		want := &model.State{
			Family:    c.fam,
			Services:  map[model.ServicePortName]*model.ServicePort{httpA: c.svc},
			Endpoints: map[model.ServicePortName][]*model.Endpoint{httpA: c.eps},
		}
		if diff := cmp.Diff(want, c.tr.State(), cmpOpts); diff != "" {
			t.Errorf("%v state (-want +got):\n%s", c.fam, diff)
		}
	}
}

// TestBadInput feeds broken objects next to a good one: nothing panics and
// the good one is unaffected.
func TestBadInput(t *testing.T) {
	bad := []*v1.Service{
		{}, // no name, no cluster IP, no ports
		svc("b1", clusterIPs("not-an-ip")),
		svc("b2", ports(v1.ServicePort{Port: -5}, v1.ServicePort{Port: 1 << 30})),
		svc("b3", ports(v1.ServicePort{Port: 53, Protocol: "QUIC"})),
		svc("b4", svcType("Bogus")),
		svc("b5", svcType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"", ":::", "1.2.3.4.5"}
			s.Spec.LoadBalancerSourceRanges = []string{"/", "1.2.3.4/33", "::/-1", "1.2.3.4"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "x"}, {IPMode: ptr(v1.LoadBalancerIPModeVIP)}}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 1 << 20
		}),
		svc("b6", with(func(s *v1.ServiceSpec) { s.IPFamilies = []v1.IPFamily{"IPv7"} }), clusterIPs("zzz")),
	}
	badSlices := []*discoveryv1.EndpointSlice{
		{},
		{AddressType: discoveryv1.AddressTypeIPv4},
		slice("bs1", "b1", []discoveryv1.EndpointPort{{}}, discoveryv1.Endpoint{}),
		slice("bs2", "b2", httpPorts, discoveryv1.Endpoint{Addresses: []string{""}}, ep("300.1.1.1"), ep("fe80::1%eth0")),
		slice("bs3", "b3", []discoveryv1.EndpointPort{{Port: ptr(int32(-1))}, {Protocol: ptr(v1.Protocol(""))}}, ep("10.1.0.9")),
		func() *discoveryv1.EndpointSlice {
			s := slice("bs4", "b4", httpPorts, ep("10.1.0.9"))
			s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{}}}
			s.Endpoints[0].NodeName = ptr("")
			return s
		}(),
	}
	good := svc("good", ports(v1.ServicePort{Name: "http", Port: 80}))
	goodSlice := slice("good-1", "good", httpPorts, ep("10.1.0.1"))
	for _, fam := range []model.IPFamily{model.IPv4, model.IPv6} {
		tr := newTracker(t, fam)
		for _, s := range bad {
			tr.OnService(nil, s)
			tr.OnService(s, s)
		}
		tr.OnService(nil, good)
		for _, s := range badSlices {
			tr.OnEndpointSlice(s, false)
		}
		tr.OnEndpointSlice(goodSlice, false)
		tr.Apply()
		for _, s := range bad {
			tr.OnService(s, nil)
		}
		for _, s := range badSlices {
			tr.OnEndpointSlice(s, true)
		}
		tr.Apply()
		if fam == model.IPv6 {
			continue
		}
		n := spn("good", "http", model.TCP)
		wantSvc := map[model.ServicePortName]*model.ServicePort{n: sp(n, 80)}
		if diff := cmp.Diff(wantSvc, tr.State().Services, cmpOpts); diff != "" {
			t.Errorf("services (-want +got):\n%s", diff)
		}
		wantEps := map[model.ServicePortName][]*model.Endpoint{n: {mep("10.1.0.1:8080")}}
		if diff := cmp.Diff(wantEps, tr.State().Endpoints, cmpOpts); diff != "" {
			t.Errorf("endpoints (-want +got):\n%s", diff)
		}
	}
}

func TestNewRejectsBadFamily(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New with family 0 did not panic")
		}
	}()
	New(Config{})
}

func TestResultString(t *testing.T) {
	r := Result{
		Changed:        changed(spn("a", "dns", model.UDP), spn("a", "", model.TCP)),
		StaleEndpoints: []StaleEndpoint{{Service: spn("a", "dns", model.UDP), Endpoint: netip.MustParseAddrPort("10.1.0.1:53")}},
		StaleServices:  []model.ServicePortName{spn("a", "dns", model.UDP)},
	}
	want := "changed=[ns/a/TCP ns/a:dns/UDP] staleEndpoints=[ns/a:dns/UDP -> 10.1.0.1:53] staleServices=[ns/a:dns/UDP]"
	if got := r.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func slicesEqualPtr(a, b []*model.Endpoint) bool {
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

// TestManyPorts covers the indexed paths used for Services with many ports.
func TestManyPorts(t *testing.T) {
	mk := func(changedPort int32) *v1.Service {
		var ps []v1.ServicePort
		for i := range int32(40) {
			p := 1000 + i
			if i == 7 {
				p = changedPort
			}
			ps = append(ps, v1.ServicePort{Name: fmt.Sprint("p", i), Port: p, Protocol: v1.ProtocolUDP})
		}
		ps = append(ps, v1.ServicePort{Name: "p3", Port: 9, Protocol: v1.ProtocolUDP}) // duplicate
		return svc("a", ports(ps...))
	}
	tr := newTracker(t, model.IPv4)
	tr.OnService(nil, mk(1007))
	if res := tr.Apply(); len(res.Changed) != 40 {
		t.Fatalf("changed %d ports, want 40", len(res.Changed))
	}
	if p := tr.State().Services[spn("a", "p3", model.UDP)]; p.Port != 1003 {
		t.Errorf("duplicate p3: port %d, want the first, 1003", p.Port)
	}
	tr.OnService(mk(1007), mk(1007))
	if tr.Pending() {
		t.Error("no-op update of a many-port Service is pending")
	}
	tr.OnService(mk(1007), mk(2007))
	res := tr.Apply()
	if diff := cmp.Diff(changed(spn("a", "p7", model.UDP)), res.Changed); diff != "" {
		t.Errorf("changed (-want +got):\n%s", diff)
	}
	tr.OnService(mk(2007), nil)
	if res := tr.Apply(); len(res.Changed) != 40 || len(res.StaleServices) != 40 || len(res.OldServices) != 40 {
		t.Errorf("delete: changed %d, stale %d, old %d; want 40 each", len(res.Changed), len(res.StaleServices), len(res.OldServices))
	}
}

// TestManyEndpointPorts covers the indexed path used for slices with many
// ports.
func TestManyEndpointPorts(t *testing.T) {
	var ps []discoveryv1.EndpointPort
	for i := range int32(12) {
		ps = append(ps, eport(fmt.Sprint("p", i), v1.ProtocolTCP, 8000+i))
	}
	tr := newTracker(t, model.IPv4)
	tr.OnEndpointSlice(slice("s1", "a", ps, ep("10.1.0.1")), false)
	tr.OnEndpointSlice(slice("s2", "a", ps[4:], ep("10.1.0.2")), false)
	if res := tr.Apply(); len(res.Changed) != 12 {
		t.Fatalf("changed %d, want 12", len(res.Changed))
	}
	want := map[model.ServicePortName][]*model.Endpoint{}
	for i := range 12 {
		n := spn("a", fmt.Sprint("p", i), model.TCP)
		want[n] = []*model.Endpoint{mep(fmt.Sprintf("10.1.0.1:%d", 8000+i))}
		if i >= 4 {
			want[n] = append(want[n], mep(fmt.Sprintf("10.1.0.2:%d", 8000+i)))
		}
	}
	if diff := cmp.Diff(want, tr.State().Endpoints, cmpOpts); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	tr.OnEndpointSlice(slice("s1", "a", nil), true)
	if res := tr.Apply(); len(res.Changed) != 12 || len(tr.State().Endpoints) != 8 {
		t.Errorf("after delete: changed %d (want 12), %d ports left (want 8)", len(res.Changed), len(tr.State().Endpoints))
	}
}

// TestEndpointAtOwnClusterIPIgnored checks that an endpoint at its
// Service's own cluster IP is left out, whichever of the Service and the
// slice comes first, and comes back when the cluster IP changes.
func TestEndpointAtOwnClusterIPIgnored(t *testing.T) {
	a := svc("a")                                                    // 10.0.0.1
	a2 := svc("a", clusterIPs("10.0.0.2"))                           // the endpoint's address no longer
	s := slice("s1", "a", httpPorts, ep("10.0.0.1"), ep("10.1.0.1")) // one at the cluster IP
	httpA := spn("a", "http", model.TCP)
	for _, order := range [][]event{{add(a), put(s)}, {put(s), add(a)}} {
		tr := newTracker(t, model.IPv4)
		for _, ev := range order {
			ev(tr)
			tr.Apply()
		}
		want := []*model.Endpoint{mep("10.1.0.1:8080")}
		if diff := cmp.Diff(want, tr.State().Endpoints[httpA], cmpOpts); diff != "" {
			t.Errorf("endpoints (-want +got):\n%s", diff)
		}
		upd(a, a2)(tr)
		res := tr.Apply()
		if _, ok := res.Changed[httpA]; !ok {
			t.Errorf("cluster IP changed: %v not reported changed", httpA)
		}
		want = []*model.Endpoint{mep("10.0.0.1:8080"), mep("10.1.0.1:8080")}
		if diff := cmp.Diff(want, tr.State().Endpoints[httpA], cmpOpts); diff != "" {
			t.Errorf("endpoints after the cluster IP changed (-want +got):\n%s", diff)
		}
	}
}
