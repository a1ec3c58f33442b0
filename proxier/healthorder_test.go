package proxier

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/healthcheck"
	"github.com/proxykit/proxykit/model"
)

// orderLog is the one log a backend and the health check servers write
// to, so that a test sees which of them moved first.
type orderLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *orderLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *orderLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// orderBackend is a recorder that logs each sync with the local
// endpoints it programs for the changed service ports of externalTrafficPolicy
// Local.
type orderBackend struct {
	*recorder
	log *orderLog
}

func (b orderBackend) Sync(ctx context.Context, req *SyncRequest) error {
	for name := range req.Changed {
		if sp, t := req.State.Services[name], req.Targets[name]; sp != nil && t != nil && sp.ExternalLocal() {
			b.log.add("dataplane %s external=%d", name.ServiceName, len(t.External))
		}
	}
	return b.recorder.Sync(ctx, req)
}

// healthRecorder stands in for the service health check servers. It
// takes a while to record, as a real server update may, so that a sync
// that does not wait for it is caught.
type healthRecorder struct{ log *orderLog }

func (h healthRecorder) Sync(services map[model.ServiceName]healthcheck.ServiceHealth) error {
	time.Sleep(20 * time.Millisecond)
	for name, s := range services {
		h.log.add("health %s local=%d", name, s.LocalEndpoints)
	}
	return nil
}

func (healthRecorder) Close() {}

// TestEngineServiceHealthOrder checks that a health check node port
// stops answering 200 before the dataplane stops accepting external
// traffic for lack of local endpoints, answers 200 again only after the
// dataplane accepts it, and that Flush returns only once the health
// check servers match the synced state.
func TestEngineServiceHealthOrder(t *testing.T) {
	log := &orderLog{}
	b := orderBackend{recorder: newRecorder(model.IPv4), log: log}
	e, err := New(Config{NodeName: "node-a", MinSyncInterval: time.Millisecond, NoConntrackCleanup: true, NoServiceHealthChecks: true}, b)
	if err != nil {
		t.Fatal(err)
	}
	e.svcHC = healthRecorder{log}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })

	svc := testService("lb", "10.96.0.2", 80)
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30080
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 30001
	slice := func(nodes ...string) {
		s := testSlice("lb", "lb-1")
		for i, n := range nodes {
			s.Endpoints = append(s.Endpoints, testSlice("lb", "x", fmt.Sprintf("10.244.1.%d", i+2)).Endpoints[0])
			s.Endpoints[i].NodeName = ptr.To(n)
		}
		e.OnEndpointSliceUpdate(nil, s)
	}
	flush := func(what string, want []string) {
		t.Helper()
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer fcancel()
		if err := e.Flush(fctx); err != nil {
			t.Fatal(err)
		}
		// Everything is in the log once Flush returns; anything late
		// shows up in the next step's lines.
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}

	e.OnServiceAdd(svc)
	slice("node-a", "node-b")
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	flush("first sync, one local endpoint", []string{"dataplane ns/lb external=1", "health ns/lb local=1"})

	slice("node-b")
	flush("local endpoint gone", []string{"health ns/lb local=0", "dataplane ns/lb external=0"})

	slice("node-a", "node-a", "node-b")
	flush("local endpoints back", []string{"dataplane ns/lb external=2", "health ns/lb local=2"})

	slice("node-a", "node-b")
	flush("one local endpoint left", []string{"health ns/lb local=1", "dataplane ns/lb external=1"})

	e.OnServiceDelete(svc)
	flush("service deleted", []string{"health ns/lb local=0"})
}
