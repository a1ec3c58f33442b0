package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
)

// nopBackend is a Backend that programs nothing.
type nopBackend struct{ family model.IPFamily }

func (b nopBackend) Name() string                             { return "nop" }
func (b nopBackend) Family() model.IPFamily                   { return b.family }
func (b nopBackend) Sync(context.Context, *SyncRequest) error { return nil }
func (b nopBackend) Cleanup(context.Context) error            { return nil }
func (b nopBackend) Close() error                             { return nil }

// feedEngine hands e every Service and EndpointSlice as added, and says
// that the initial lists are complete.
func feedEngine(e *Engine, objs []*v1.Service, slices []*discoveryv1.EndpointSlice) {
	for _, o := range objs {
		e.OnServiceAdd(o)
	}
	for _, s := range slices {
		e.OnEndpointSliceAdd(s)
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
}

// BenchmarkOneEndpointChange measures the engine's own work for one
// endpoint change (tracker apply, target selection, metrics and the
// health check bookkeeping; no health check servers and no conntrack
// cleanup, which need a network namespace), with a backend that does
// nothing: it must not grow with the number of services.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{100, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e, err := New(Config{NoConntrackCleanup: true, NoServiceHealthChecks: true}, nopBackend{model.IPv4})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			addr := func(first byte, i int) string {
				return netip.AddrFrom4([4]byte{first, byte(i >> 16), byte(i >> 8), byte(i)}).String()
			}
			slices := make([]*discoveryv1.EndpointSlice, n)
			for i := range n {
				name := fmt.Sprintf("svc-%d", i)
				e.OnServiceAdd(testService(name, addr(10, i), 80))
				var ips []string
				for j := range 10 {
					ips = append(ips, addr(11, i*10+j))
				}
				slices[i] = testSlice(name, name+"-x", ips...)
				e.OnEndpointSliceAdd(slices[i])
			}
			e.OnServiceSynced()
			e.OnEndpointSlicesSynced()
			ctx := context.Background()
			if ok, _ := e.syncOnce(ctx, false); !ok {
				b.Fatal("first sync failed")
			}
			// Two versions of one slice, alternating.
			alt := slices[n/2].DeepCopy()
			alt.Endpoints = alt.Endpoints[:9]
			versions := []*discoveryv1.EndpointSlice{alt, slices[n/2]}
			i := 0
			for b.Loop() {
				e.OnEndpointSliceUpdate(nil, versions[i%2])
				i++
				if ok, _ := e.syncOnce(ctx, false); !ok {
					b.Fatal("sync failed")
				}
			}
		})
	}
}

// BenchmarkOneEndpointChangeBigService is [BenchmarkOneEndpointChange]
// for 10 services of many endpoints each, in EndpointSlices of 100 as
// the EndpointSlice controller fills them: one endpoint of one slice
// replaced. The engine's work may grow with the endpoints of the changed
// service, at most linearly.
func BenchmarkOneEndpointChangeBigService(b *testing.B) {
	for _, eps := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", eps), func(b *testing.B) {
			e, err := New(Config{NoConntrackCleanup: true, NoServiceHealthChecks: true}, nopBackend{model.IPv4})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			svcs := scale.Services(10, eps)
			objs, slices := scale.Objects(svcs)
			feedEngine(e, objs, slices)
			ctx := context.Background()
			if ok, _ := e.syncOnce(ctx, false); !ok {
				b.Fatal("first sync failed")
			}
			// Two versions of the first slice of service 5, alternating.
			_, upd := scale.Change(svcs, 0)
			versions := []*discoveryv1.EndpointSlice{upd.Slice(1), svcs[5].Slice(2)}
			if upd.Name != svcs[5].Name {
				b.Fatalf("change 0 is of %s", upd.Name)
			}
			i := 0
			for b.Loop() {
				e.OnEndpointSliceUpdate(nil, versions[i%2])
				i++
				if ok, _ := e.syncOnce(ctx, false); !ok {
					b.Fatal("sync failed")
				}
			}
		})
	}
}

// BenchmarkFirstSync is the engine's part of a proxier's first sync of
// n services of 10 endpoints (internal/scale's, as cmd/proxykit-bench
// feeds them): the tracker's first Apply, prepare (owners, targets,
// health check counts), the bookkeeping after the backend's sync and the
// conntrack hook's choice of what to clean (not the cleaning, which
// needs a network namespace), with a backend that does nothing. Each
// iteration feeds a new engine with the timer stopped (issue 22).
func BenchmarkFirstSync(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			objs, slices := scale.Objects(scale.Services(n, 10))
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()        // not the objects' making
			var cpu time.Duration // of the syncs, the garbage collector's included
			for range b.N {
				b.StopTimer()
				e, err := New(Config{NoConntrackCleanup: true, NoServiceHealthChecks: true}, nopBackend{model.IPv4})
				if err != nil {
					b.Fatal(err)
				}
				ct := &conntrackHook{last: map[model.IPFamily]map[model.ServicePortName]*model.ServicePort{}}
				e.hooks = append(e.hooks, func(_ context.Context, be Backend, req *SyncRequest) {
					ct.valid(be.Family(), req)
				})
				feedEngine(e, objs, slices)
				b.StartTimer()
				start := cputime.Process()
				if ok, _ := e.syncOnce(ctx, false); !ok {
					b.Fatal("first sync failed")
				}
				cpu += cputime.Process() - start
				b.StopTimer()
				e.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
