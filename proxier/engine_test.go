package proxier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dto "github.com/prometheus/client_model/go"

	"github.com/proxykit/proxykit/model"
)

// recorder is a Backend that records what it was asked to do.
type recorder struct {
	family model.IPFamily

	mu       sync.Mutex
	reqs     []recorded
	failNext int   // fail this many syncs
	objErr   error // returned (as the only error) when set
	synced   chan struct{}
}

type recorded struct {
	full     bool
	changed  []string
	services int
	targets  map[model.ServicePortName]*Targets
}

func newRecorder(f model.IPFamily) *recorder {
	return &recorder{family: f, synced: make(chan struct{}, 100)}
}

func (r *recorder) Name() string           { return "recorder" }
func (r *recorder) Family() model.IPFamily { return r.family }
func (r *recorder) Cleanup(context.Context) error {
	return nil
}
func (r *recorder) Close() error { return nil }

func (r *recorder) Sync(_ context.Context, req *SyncRequest) error {
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.synced <- struct{}{}
	}()
	rec := recorded{full: req.Full, services: len(req.State.Services), targets: map[model.ServicePortName]*Targets{}}
	for n := range req.Changed {
		rec.changed = append(rec.changed, n.String())
	}
	for n, t := range req.Targets {
		rec.targets[n] = t
	}
	r.reqs = append(r.reqs, rec)
	if r.failNext > 0 {
		r.failNext--
		return errors.New("injected failure")
	}
	return r.objErr
}

func (r *recorder) requests() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.reqs...)
}

func (r *recorder) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(r.requests()) < n {
		select {
		case <-r.synced:
		case <-deadline:
			t.Fatalf("waited for %d syncs, got %d", n, len(r.requests()))
		}
	}
}

func testService(name, ip string, port int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports:      []v1.ServicePort{{Name: "p", Port: port, Protocol: v1.ProtocolTCP}},
		},
	}
}

func testSlice(svc, name string, ips ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func newTestEngine(t *testing.T, cfg Config, backends ...Backend) (*Engine, context.CancelFunc) {
	t.Helper()
	cfg.NoConntrackCleanup = true
	cfg.NoServiceHealthChecks = true
	cfg.Families = nil
	e, err := New(cfg, backends...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })
	return e, cancel
}

func TestEngineWaitsForInitialLists(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond}, r)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	e.OnServiceSynced()
	time.Sleep(100 * time.Millisecond)
	if n := len(r.requests()); n != 0 {
		t.Fatalf("synced %d times before EndpointSlices were synced", n)
	}
	e.OnEndpointSlicesSynced()
	r.wait(t, 1)
	got := r.requests()[0]
	if !got.full || got.services != 1 {
		t.Fatalf("first sync = %+v, want full with 1 service", got)
	}
}

func TestEngineCoalescesBursts(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 300 * time.Millisecond}, r)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	r.wait(t, 1)
	for i := range 100 {
		e.OnServiceAdd(testService(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", i+1), 80))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := r.requests()
	// The burst arrived within one minimum interval of the first sync,
	// so it must be one sync (two if the burst straddled a sync start).
	if len(reqs) > 3 {
		t.Fatalf("100 events took %d syncs, want them coalesced", len(reqs)-1)
	}
	last := reqs[len(reqs)-1]
	if last.services != 100 {
		t.Fatalf("last sync saw %d services, want 100", last.services)
	}
	total := 0
	for _, q := range reqs[1:] {
		total += len(q.changed)
		if q.full {
			t.Fatalf("incremental change was handed over as a full sync")
		}
	}
	if total != 100 {
		t.Fatalf("changed names over the burst = %d, want 100", total)
	}
}

func TestEngineRetriesFailedSyncAsFull(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, RetryInterval: 20 * time.Millisecond}, r)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	r.wait(t, 1)
	r.mu.Lock()
	r.failNext = 2
	r.mu.Unlock()
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := r.requests()
	if len(reqs) != 4 {
		t.Fatalf("got %d syncs, want initial + 2 failures + success", len(reqs))
	}
	if reqs[1].full || !reqs[2].full || !reqs[3].full {
		t.Fatalf("want the attempt after a failure to be full: %+v", reqs)
	}
	if len(reqs[3].changed) != 1 {
		t.Fatalf("changes were lost across failures: %+v", reqs[3])
	}
}

func TestEngineObjectErrorsDoNotRetry(t *testing.T) {
	r := newRecorder(model.IPv4)
	r.objErr = errors.Join(&ObjectError{Service: model.ServicePortName{Port: "x"}, Err: errors.New("too big")})
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, RetryInterval: 10 * time.Millisecond}, r)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(r.requests()); n != 1 {
		t.Fatalf("object errors caused %d syncs, want 1", n)
	}
}

func TestEnginePeriodicFullResync(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, SyncPeriod: 100 * time.Millisecond}, r)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	r.wait(t, 3)
	for i, q := range r.requests()[:3] {
		if !q.full {
			t.Fatalf("sync %d is not full; periodic syncs must be", i)
		}
	}
}

func TestEngineDualStackRoutesByFamily(t *testing.T) {
	r4, r6 := newRecorder(model.IPv4), newRecorder(model.IPv6)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond}, r4, r6)
	svc := testService("dual", "10.96.0.10", 80)
	svc.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
	e.OnServiceAdd(svc)
	e.OnServiceAdd(testService("v4only", "10.96.0.11", 80))
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r4.requests()[0].services; got != 2 {
		t.Fatalf("IPv4 backend got %d services, want 2", got)
	}
	if got := r6.requests()[0].services; got != 1 {
		t.Fatalf("IPv6 backend got %d services, want 1", got)
	}
}

func TestEngineTargetsFollowEndpoints(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, NodeName: "n1"}, r)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	e.OnEndpointSliceAdd(testSlice("a", "a-1", "10.244.1.2", "10.244.2.2"))
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	name := model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: "a"}, Port: "p", Protocol: model.TCP}
	reqs := r.requests()
	tg := reqs[len(reqs)-1].targets[name]
	if tg == nil || len(tg.Internal) != 2 || !tg.HasEndpoints {
		t.Fatalf("targets = %+v, want 2 internal endpoints", tg)
	}
	e.OnEndpointSliceUpdate(nil, testSlice("a", "a-1", "10.244.1.2"))
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	reqs = r.requests()
	last := reqs[len(reqs)-1]
	if tg := last.targets[name]; len(tg.Internal) != 1 || tg.Internal[0].Addr.String() != "10.244.1.2:8080" {
		t.Fatalf("after update targets = %+v", tg)
	}
	if len(last.changed) != 1 || last.changed[0] != name.String() {
		t.Fatalf("changed = %v, want [%s]", last.changed, name)
	}
}

// closeCounter is a recorder that counts its Close calls.
type closeCounter struct {
	*recorder
	closed *int
}

func (c closeCounter) Close() error { *c.closed++; return nil }

func TestNewPerFamily(t *testing.T) {
	cfg := Config{NoConntrackCleanup: true, NoServiceHealthChecks: true}
	closed := 0
	var built []model.IPFamily
	e, err := NewPerFamily(cfg, func(f model.IPFamily) (Backend, error) {
		built = append(built, f)
		return closeCounter{newRecorder(f), &closed}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != 2 || built[0] != model.IPv4 || built[1] != model.IPv6 {
		t.Errorf("built %v, want IPv4 and IPv6 (the default families)", built)
	}
	e.Close()
	if closed != 2 {
		t.Errorf("Close closed %d backends, want 2", closed)
	}

	// A failure in the second family closes the first and returns the error.
	closed = 0
	boom := errors.New("boom")
	_, err = NewPerFamily(cfg, func(f model.IPFamily) (Backend, error) {
		if f == model.IPv6 {
			return nil, boom
		}
		return closeCounter{newRecorder(f), &closed}, nil
	})
	if !errors.Is(err, boom) || closed != 1 {
		t.Errorf("err %v, %d backends closed; want boom and 1", err, closed)
	}

	// The engine refusing the backends closes them too.
	closed = 0
	cfg.Families = []model.IPFamily{model.IPv4, model.IPv4}
	if _, err = NewPerFamily(cfg, func(f model.IPFamily) (Backend, error) {
		return closeCounter{newRecorder(f), &closed}, nil
	}); err == nil || closed != 2 {
		t.Errorf("two IPv4 backends: err %v, %d closed; want an error and 2", err, closed)
	}
}

// TestEngineLocalPolicyBookkeeping follows the gauge of Local-policy
// service ports without a local endpoint and the health check node port
// counts, which the engine keeps up to date from the changed service
// ports only, through partial and full syncs.
func TestEngineLocalPolicyBookkeeping(t *testing.T) {
	e, err := New(Config{NodeName: "node-a", NoConntrackCleanup: true, NoServiceHealthChecks: true}, newRecorder(model.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	sync := func(periodic bool) {
		t.Helper()
		if ok, ready := e.syncOnce(ctx, periodic); !ok || !ready {
			t.Fatalf("sync: ok %v, ready %v", ok, ready)
		}
	}
	gauge := func(kind string) int {
		var m dto.Metric
		if err := e.metrics.noLocalEndpoints.WithLabelValues(kind, "IPv4").Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetGauge().GetValue())
	}
	f := e.families[0]
	check := func(what string, internal, external, health int) {
		t.Helper()
		for _, periodic := range []bool{false, true} {
			sync(periodic)
			if gi, ge := gauge("internal"), gauge("external"); gi != internal || ge != external {
				t.Errorf("%s (periodic %v): no local endpoints internal %d, external %d; want %d, %d", what, periodic, gi, ge, internal, external)
			}
			local := -1
			for _, h := range f.health {
				local = h.local
			}
			if local != health {
				t.Errorf("%s (periodic %v): health check local endpoints %d, want %d (-1: none)", what, periodic, local, health)
			}
		}
	}
	slice := func(svc, node string) *discoveryv1.EndpointSlice {
		s := testSlice(svc, svc+"-1", "10.244.1.2")
		s.Endpoints[0].NodeName = ptr.To(node)
		return s
	}
	internal := testService("internal", "10.96.0.1", 80)
	internal.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	external := testService("external", "10.96.0.2", 80)
	external.Spec.Type = v1.ServiceTypeLoadBalancer
	external.Spec.Ports[0].NodePort = 30080
	external.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	external.Spec.HealthCheckNodePort = 30001
	e.OnServiceAdd(internal)
	e.OnServiceAdd(external)
	e.OnEndpointSliceAdd(slice("internal", "node-b"))
	e.OnEndpointSliceAdd(slice("external", "node-b"))
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	check("both remote", 1, 1, 0)
	e.OnEndpointSliceUpdate(nil, slice("internal", "node-a"))
	check("internal local", 0, 1, 0)
	e.OnEndpointSliceUpdate(nil, slice("external", "node-a"))
	check("both local", 0, 0, 1)
	e.OnEndpointSliceUpdate(nil, slice("external", "node-b"))
	check("external remote again", 0, 1, 0)
	e.OnServiceDelete(external)
	check("external deleted", 0, 0, -1)
	e.OnEndpointSliceUpdate(nil, slice("internal", "node-b"))
	check("internal remote again", 1, 0, -1)
}

// TestEngineFailedPartialSyncRetriesFullAtOnce checks that a partial sync
// the backend fails (the kernel no longer matches what it remembers) is
// followed at once by a full sync, not after the retry interval, and is
// counted as a failed sync.
func TestEngineFailedPartialSyncRetriesFullAtOnce(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, RetryInterval: time.Hour, SyncPeriod: time.Hour}, r)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	r.wait(t, 1)
	r.mu.Lock()
	r.failNext = 1
	r.mu.Unlock()
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v (the full sync waited for the retry interval)", err)
	}
	reqs := r.requests()
	if len(reqs) != 3 || reqs[1].full || !reqs[2].full || len(reqs[2].changed) != 1 {
		t.Fatalf("got %+v; want the initial sync, a failed partial one, then a full one with the change", reqs)
	}
	var m dto.Metric
	if err := e.metrics.syncFailures.WithLabelValues("IPv4").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("sync failures counted: %v, want 1", got)
	}
}
