package proxier

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

// BenchmarkInitialList delivers the initial list of a big cluster, 30,000
// Services and their EndpointSlices, to an engine before its first sync,
// as a source does at start: the cost of an event must not grow with the
// number of events pending (it did, through the pending-changes gauge:
// 30,000 Services took seconds).
func BenchmarkInitialList(b *testing.B) {
	const n = 30000
	svcs := make([]*v1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = testService(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80)
		slices[i] = testSlice(name, name+"-1", fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256))
	}
	for b.Loop() {
		e, err := New(Config{NoConntrackCleanup: true, NoServiceHealthChecks: true}, newRecorder(model.IPv4))
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			e.OnServiceAdd(svcs[i])
			e.OnEndpointSliceAdd(slices[i])
		}
		e.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(2*n), "ns/event")
}
