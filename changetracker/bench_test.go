package changetracker

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/model"
)

const benchEndpoints = 10 // per service

// benchObjects returns n Services, each with one EndpointSlice of
// benchEndpoints endpoints.
func benchObjects(n int) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{
				Type:       v1.ServiceTypeClusterIP,
				ClusterIP:  benchAddr(10, i).String(),
				ClusterIPs: []string{benchAddr(10, i).String()},
				Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			},
		}
		slices[i] = benchSlice(name, i, 0)
	}
	return svcs, slices
}

// benchSlice returns the slice of service i; gen varies the last endpoint.
func benchSlice(name string, i, gen int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-abcde",
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for j := range benchEndpoints {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{benchAddr(11, i*benchEndpoints+j).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(fmt.Sprintf("node-%d", j)),
			Zone:       ptr("zone-a"),
		})
	}
	if gen%2 == 1 {
		s.Endpoints[benchEndpoints-1].Conditions.Ready = ptr(false)
	}
	return s
}

func benchAddr(first byte, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{first, byte(i >> 16), byte(i >> 8), byte(i)})
}

// feedTracker feeds tr every Service and EndpointSlice as added.
func feedTracker(tr *Tracker, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) {
	for _, s := range svcs {
		tr.OnService(nil, s)
	}
	for _, s := range slices {
		tr.OnEndpointSlice(s, false)
	}
}

// BenchmarkInitialLoad feeds all Services and EndpointSlices to a new
// tracker and applies once.
func BenchmarkInitialLoad(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			b.ReportAllocs()
			for b.Loop() {
				tr := New(Config{Family: model.IPv4, NodeName: "node-0"})
				feedTracker(tr, svcs, slices)
				if res := tr.Apply(); len(res.Changed) != n {
					b.Fatalf("changed %d, want %d", len(res.Changed), n)
				}
			}
			b.ReportMetric(float64(n*benchEndpoints), "endpoints")
		})
	}
}

// BenchmarkOneSliceUpdate changes one endpoint of one slice of a loaded
// tracker and applies, per iteration. It walks through all the slices in
// turn, as a busy cluster would, so at 10,000 services it also pays for
// cache misses on a working set ten times larger (including the prebuilt
// input objects, which an informer would deliver hot);
// BenchmarkSameSliceUpdate isolates the tracker's own work.
func BenchmarkOneSliceUpdate(b *testing.B) {
	benchUpdate(b, func(i, n int) int { return i % n })
}

// BenchmarkSameSliceUpdate is BenchmarkOneSliceUpdate updating the same
// slice every time: the work per Apply, without the memory effects of a
// large working set. It must not grow with the number of services.
func BenchmarkSameSliceUpdate(b *testing.B) {
	benchUpdate(b, func(i, n int) int { return n / 2 })
}

func benchUpdate(b *testing.B, pick func(i, n int) int) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			alt := make([]*discoveryv1.EndpointSlice, n)
			for i, s := range svcs {
				alt[i] = benchSlice(s.Name, i, 1)
			}
			tr := New(Config{Family: model.IPv4, NodeName: "node-0"})
			feedTracker(tr, svcs, slices)
			tr.Apply()
			toggled := make([]bool, n)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := pick(i, n)
				i++
				s := alt[k]
				if toggled[k] {
					s = slices[k]
				}
				toggled[k] = !toggled[k]
				tr.OnEndpointSlice(s, false)
				if res := tr.Apply(); len(res.Changed) != 1 {
					b.Fatalf("changed %d, want 1", len(res.Changed))
				}
			}
		})
	}
}

// BenchmarkFirstApply is the first Apply after the initial lists, alone:
// every Service and EndpointSlice pending, fed with the timer stopped.
// At 100,000 services it is the tracker's part of a proxier's first sync
// (issue 22).
func BenchmarkFirstApply(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			b.ReportAllocs()
			b.ResetTimer() // not the objects' making
			for range b.N {
				b.StopTimer()
				tr := New(Config{Family: model.IPv4, NodeName: "node-0"})
				feedTracker(tr, svcs, slices)
				b.StartTimer()
				if res := tr.Apply(); len(res.Changed) != n {
					b.Fatalf("changed %d, want %d", len(res.Changed), n)
				}
			}
		})
	}
}
