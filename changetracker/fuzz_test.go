package changetracker

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/model"
)

// FuzzTracker decodes the input into a sequence of Service and
// EndpointSlice events over a small pool of objects, some of them invalid,
// with Applies in between, and checks that:
//   - nothing panics;
//   - after every Apply, Changed, StaleEndpoints and StaleServices match a
//     naive diff of the state before and after, published values were not
//     modified, and the state is well formed;
//   - at the end, the state equals that of a fresh tracker fed only the
//     final objects.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 6})
	f.Add([]byte{3, 0, 0, 1, 1, 2, 0, 0, 0, 4, 0, 1, 0, 0, 6, 5, 0, 6})
	f.Add([]byte{0, 0, 3, 2, 0, 1, 1, 1, 0, 0, 0, 3, 3, 0, 0, 0, 2, 1, 1, 0, 0, 2, 6, 2, 0, 6})
	f.Add([]byte("service and slices, a fairly long seed to get many events going 0123456789"))
	f.Fuzz(fuzzOnce)
}

// fuzzOnce runs one FuzzTracker input.
func fuzzOnce(t *testing.T, data []byte) {
	r := &fuzzReader{b: data}
	w := &fuzzWorld{
		svcs:   make(map[string]*v1.Service),
		slices: make(map[string]*discoveryv1.EndpointSlice),
	}
	trackers := []*fuzzTracked{newFuzzTracked(model.IPv4), newFuzzTracked(model.IPv6)}
	for n := 0; !r.empty() && n < 300; n++ {
		w.step(r, trackers, t)
	}
	for _, ft := range trackers {
		ft.apply(t)
		fresh := New(Config{Family: ft.tr.family, NodeName: "node1"})
		for _, k := range slices.Sorted(maps.Keys(w.svcs)) {
			fresh.OnService(nil, w.svcs[k])
		}
		for _, k := range slices.Sorted(maps.Keys(w.slices)) {
			fresh.OnEndpointSlice(w.slices[k], false)
		}
		fresh.Apply()
		if diff := cmp.Diff(fresh.State(), ft.tr.State(), cmpOpts); diff != "" {
			t.Fatalf("%v: incremental state differs from a fresh one (-fresh +incremental):\n%s", ft.tr.family, diff)
		}
	}
}

type fuzzReader struct{ b []byte }

func (r *fuzzReader) empty() bool { return len(r.b) == 0 }

// pick returns a number in [0, n), 0 once the input is exhausted.
func (r *fuzzReader) pick(n int) int {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return int(c) % n
}

func pickOf[T any](r *fuzzReader, vs ...T) T { return vs[r.pick(len(vs))] }

// fuzzWorld is the set of objects as the API server would have them.
type fuzzWorld struct {
	svcs   map[string]*v1.Service
	slices map[string]*discoveryv1.EndpointSlice
}

var (
	fuzzSvcNames   = []string{"a", "b", "c"}
	fuzzSliceNames = []string{"s1", "s2", "s3", "s4"}
)

func (w *fuzzWorld) step(r *fuzzReader, trackers []*fuzzTracked, t *testing.T) {
	each := func(f func(*Tracker)) {
		for _, ft := range trackers {
			f(ft.tr)
		}
	}
	switch r.pick(8) {
	case 0, 1: // add or update a service
		name := pickOf(r, fuzzSvcNames...)
		s := genService(r, name)
		old := w.svcs[name]
		each(func(tr *Tracker) { tr.OnService(old, s) })
		w.svcs[name] = s
	case 2: // delete a service, known or not
		name := pickOf(r, fuzzSvcNames...)
		old := w.svcs[name]
		if old == nil {
			old = genService(r, name)
		}
		each(func(tr *Tracker) { tr.OnService(old, nil) })
		delete(w.svcs, name)
	case 3, 4: // add or update a slice
		name := pickOf(r, fuzzSliceNames...)
		s := genSlice(r, name)
		each(func(tr *Tracker) { tr.OnEndpointSlice(s, false) })
		w.slices[name] = s
	case 5: // delete a slice, known or not, as the informer last saw it
		name := pickOf(r, fuzzSliceNames...)
		old := w.slices[name]
		if old == nil {
			old = genSlice(r, name)
		}
		each(func(tr *Tracker) { tr.OnEndpointSlice(old, true) })
		delete(w.slices, name)
	case 6:
		for _, ft := range trackers {
			ft.apply(t)
		}
	case 7: // an update whose old object is not what was delivered before
		name := pickOf(r, fuzzSvcNames...)
		old, s := genService(r, name), genService(r, name)
		each(func(tr *Tracker) { tr.OnService(old, s) })
		w.svcs[name] = s
	}
}

func genService(r *fuzzReader, name string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	spec := &s.Spec
	spec.ClusterIPs = pickOf(r,
		[]string{"10.0.0.1"}, []string{"10.0.0.2"}, []string{"fd00::1"},
		[]string{"10.0.0.1", "fd00::1"}, []string{"fd00::2", "10.0.0.2"},
		[]string{"bogus"}, []string{"None"}, nil, []string{"10.0.0.1", "10.0.0.3"},
		[]string{"10.0.0.1", "fd00::zz"})
	if len(spec.ClusterIPs) > 0 {
		spec.ClusterIP = spec.ClusterIPs[0]
	}
	if r.pick(2) == 0 {
		for range spec.ClusterIPs {
			spec.IPFamilies = append(spec.IPFamilies, pickOf(r, v1.IPv4Protocol, v1.IPv6Protocol))
		}
	}
	spec.Type = pickOf(r, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer,
		v1.ServiceTypeExternalName, "")
	switch r.pick(6) {
	case 1:
		s.Labels = map[string]string{LabelServiceProxyName: "other"}
	case 2:
		s.Labels = map[string]string{v1.IsHeadlessService: ""}
	case 3:
		s.Labels = map[string]string{"app": pickOf(r, "x", "y")}
	}
	for range r.pick(4) {
		spec.Ports = append(spec.Ports, v1.ServicePort{
			Name:     pickOf(r, "", "p", "q"),
			Protocol: pickOf[v1.Protocol](r, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "", "ICMP"),
			Port:     pickOf[int32](r, 53, 80, 0, 70000, -1),
			NodePort: pickOf[int32](r, 0, 30000, 30001, 99999),
		})
	}
	spec.ExternalIPs = pickOf(r, nil, []string{"192.0.2.1"}, []string{"2001:db8::1", "bad", "192.0.2.2"})
	spec.ExternalTrafficPolicy = pickOf[v1.ServiceExternalTrafficPolicy](r, "", v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal)
	spec.HealthCheckNodePort = pickOf[int32](r, 0, 30100, -1)
	spec.InternalTrafficPolicy = pickOf(r, nil, ptr(v1.ServiceInternalTrafficPolicyLocal), ptr(v1.ServiceInternalTrafficPolicyCluster))
	switch r.pick(4) {
	case 1:
		spec.SessionAffinity = v1.ServiceAffinityClientIP
	case 2:
		spec.SessionAffinity = v1.ServiceAffinityClientIP
		spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{
			TimeoutSeconds: pickOf(r, nil, ptr(int32(0)), ptr(int32(60))),
		}}
	}
	s.Status.LoadBalancer.Ingress = pickOf(r, nil,
		[]v1.LoadBalancerIngress{{IP: "5.6.7.8"}},
		[]v1.LoadBalancerIngress{{IP: "5.6.7.9", IPMode: ptr(v1.LoadBalancerIPModeProxy)}, {Hostname: "h"}},
		[]v1.LoadBalancerIngress{{IP: "2001:db8::5"}, {IP: "bad"}, {IP: "5.6.7.8", IPMode: ptr(v1.LoadBalancerIPModeVIP)}})
	switch r.pick(4) {
	case 1:
		spec.LoadBalancerSourceRanges = []string{"1.2.3.0/24", "2001:db8::/32"}
	case 2:
		s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "1.2.3.0/24,bad"}
	}
	spec.TrafficDistribution = pickOf(r, nil, ptr(v1.ServiceTrafficDistributionPreferClose),
		ptr(v1.ServiceTrafficDistributionPreferSameNode), ptr("x"))
	return s
}

func genSlice(r *fuzzReader, name string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	if svc := r.pick(4); svc < len(fuzzSvcNames) {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: fuzzSvcNames[svc]}
	}
	s.AddressType = pickOf(r, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv4,
		discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN)
	for range r.pick(3) {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{
			Name:     pickOf(r, nil, ptr(""), ptr("p"), ptr("q")),
			Protocol: pickOf(r, nil, ptr(v1.ProtocolTCP), ptr(v1.ProtocolUDP), ptr(v1.ProtocolSCTP), ptr(v1.Protocol("ICMP"))),
			Port:     pickOf(r, nil, ptr(int32(53)), ptr(int32(80)), ptr(int32(0))),
		})
	}
	for range r.pick(6) {
		e := discoveryv1.Endpoint{
			Addresses: pickOf(r, []string{"10.1.0.1"}, []string{"10.1.0.2"}, []string{"10.1.0.3"},
				[]string{"fd01::1"}, []string{"fd01::2"}, []string{"bad"}, nil),
			Conditions: discoveryv1.EndpointConditions{
				Ready:       pickOf(r, nil, tru, fls),
				Serving:     pickOf(r, nil, tru, fls),
				Terminating: pickOf(r, nil, tru, fls),
			},
			NodeName: pickOf(r, nil, ptr("node1"), ptr("node2")),
			Zone:     pickOf(r, nil, ptr("z1")),
			Hints: pickOf(r, nil,
				&discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
				&discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: "node1"}}},
				&discoveryv1.EndpointHints{}),
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

// fuzzTracked is a tracker plus what the checks remember about it.
type fuzzTracked struct {
	tr        *Tracker
	prevSvcs  map[model.ServicePortName]*model.ServicePort
	prevEps   map[model.ServicePortName][]*model.Endpoint
	published map[*model.ServicePort]model.ServicePort
	pubEps    map[*model.Endpoint]model.Endpoint
}

func newFuzzTracked(fam model.IPFamily) *fuzzTracked {
	return &fuzzTracked{
		tr:        New(Config{Family: fam, NodeName: "node1"}),
		published: make(map[*model.ServicePort]model.ServicePort),
		pubEps:    make(map[*model.Endpoint]model.Endpoint),
	}
}

func (ft *fuzzTracked) apply(t *testing.T) {
	t.Helper()
	res := ft.tr.Apply()
	st := ft.tr.State()
	fam := ft.tr.family
	if ft.tr.Pending() {
		t.Fatalf("%v: pending after Apply", fam)
	}

	// Published values are never modified.
	for p, v := range ft.published {
		if !reflect.DeepEqual(*p, v) {
			t.Fatalf("%v: published ServicePort %v modified:\n%s", fam, v.Name, cmp.Diff(v, *p, cmpOpts))
		}
	}
	for p, v := range ft.pubEps {
		if !reflect.DeepEqual(*p, v) {
			t.Fatalf("%v: published Endpoint %v modified", fam, v.Addr)
		}
	}

	// Well formed.
	for n, p := range st.Services {
		if p.Name != n || p.Protocol != n.Protocol || !n.Protocol.Valid() || p.Port == 0 || !fam.Contains(p.ClusterIP) {
			t.Fatalf("%v: bad service port %v: %+v", fam, n, p)
		}
		for _, a := range slices.Concat(p.ExternalIPs, p.LoadBalancerIPs) {
			if !fam.Contains(a) {
				t.Fatalf("%v: %v has an address of the other family: %v", fam, n, a)
			}
		}
		for _, pr := range p.LoadBalancerSourceRanges {
			if !fam.Contains(pr.Addr()) {
				t.Fatalf("%v: %v has a source range of the other family: %v", fam, n, pr)
			}
		}
		if _, ok := ft.published[p]; !ok {
			ft.published[p] = clonePort(p)
		}
	}
	for n, eps := range st.Endpoints {
		if len(eps) == 0 || !n.Protocol.Valid() {
			t.Fatalf("%v: bad endpoints entry %v: %v", fam, n, eps)
		}
		for i, e := range eps {
			if !fam.Contains(e.Addr.Addr()) || e.Addr.Port() == 0 {
				t.Fatalf("%v: %v: bad endpoint %v", fam, n, e.Addr)
			}
			if i > 0 && eps[i-1].Addr.Compare(e.Addr) >= 0 {
				t.Fatalf("%v: %v: endpoints not sorted and unique: %v", fam, n, eps)
			}
			if e.Ready && (!e.Serving || e.Terminating) {
				t.Fatalf("%v: %v: ready endpoint %v not serving or terminating", fam, n, e.Addr)
			}
			if _, ok := ft.pubEps[e]; !ok {
				ft.pubEps[e] = cloneEndpoint(e)
			}
		}
	}

	// Changed, stale lists and old values against a naive diff.
	wantChanged := make(map[model.ServicePortName]struct{})
	wantOld := make(map[model.ServicePortName]*model.ServicePort)
	var wantStale []StaleEndpoint
	var wantStaleSvc []model.ServicePortName
	names := make(map[model.ServicePortName]struct{})
	for _, m := range []map[model.ServicePortName]*model.ServicePort{ft.prevSvcs, st.Services} {
		for n := range m {
			names[n] = struct{}{}
		}
	}
	for _, m := range []map[model.ServicePortName][]*model.Endpoint{ft.prevEps, st.Endpoints} {
		for n := range m {
			names[n] = struct{}{}
		}
	}
	for n := range names {
		op, np := ft.prevSvcs[n], st.Services[n]
		svcChanged := !reflect.DeepEqual(op, np)
		if svcChanged && op != nil {
			wantOld[n] = op
		}
		if svcChanged || !reflect.DeepEqual(ft.prevEps[n], st.Endpoints[n]) {
			wantChanged[n] = struct{}{}
		}
		if !n.Protocol.Connectionless() {
			continue
		}
		if op != nil && np == nil {
			wantStaleSvc = append(wantStaleSvc, n)
		}
		serving := make(map[netip.AddrPort]bool)
		nowServing := 0
		for _, e := range st.Endpoints[n] {
			serving[e.Addr] = e.Serving
			if e.Serving {
				nowServing++
			}
		}
		wasServing := 0
		for _, e := range ft.prevEps[n] {
			if e.Serving {
				wasServing++
				if !serving[e.Addr] {
					wantStale = append(wantStale, StaleEndpoint{Service: n, Endpoint: e.Addr})
				}
			}
		}
		if wasServing == 0 && nowServing > 0 && !(op != nil && np == nil) {
			wantStaleSvc = append(wantStaleSvc, n)
		}
	}
	if diff := cmp.Diff(wantChanged, res.Changed); diff != "" {
		t.Fatalf("%v: Changed (-want +got):\n%s", fam, diff)
	}
	if diff := cmp.Diff(wantOld, res.OldServices, cmpOpts, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("%v: OldServices (-want +got):\n%s", fam, diff)
	}
	slices.SortFunc(wantStale, func(a, b StaleEndpoint) int {
		if c := comparePortName(a.Service, b.Service); c != 0 {
			return c
		}
		return a.Endpoint.Compare(b.Endpoint)
	})
	slices.SortFunc(wantStaleSvc, comparePortName)
	if diff := cmp.Diff(wantStale, res.StaleEndpoints, cmpOpts); diff != "" {
		t.Fatalf("%v: StaleEndpoints (-want +got):\n%s", fam, diff)
	}
	if diff := cmp.Diff(wantStaleSvc, res.StaleServices); diff != "" {
		t.Fatalf("%v: StaleServices (-want +got):\n%s", fam, diff)
	}

	ft.prevSvcs = maps.Clone(st.Services)
	ft.prevEps = maps.Clone(st.Endpoints)
}

func clonePort(p *model.ServicePort) model.ServicePort {
	c := *p
	c.ExternalIPs = slices.Clone(p.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(p.LoadBalancerIPs)
	c.LoadBalancerSourceRanges = slices.Clone(p.LoadBalancerSourceRanges)
	return c
}

func cloneEndpoint(e *model.Endpoint) model.Endpoint {
	c := *e
	c.ZoneHints = slices.Clone(e.ZoneHints)
	c.NodeHints = slices.Clone(e.NodeHints)
	return c
}

// TestRandomSequences runs the FuzzTracker checks on pseudo-random inputs,
// so a plain go test covers more than the seed corpus.
func TestRandomSequences(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 30
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		data := make([]byte, rnd.IntN(2000))
		for j := range data {
			data[j] = byte(rnd.Uint32())
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { fuzzOnce(t, data) })
	}
}
