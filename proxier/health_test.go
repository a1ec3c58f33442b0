package proxier

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/model"
)

type fixedHealth Health

func (f fixedHealth) Health() Health { return Health(f) }

func TestHealthHandler(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name           string
		h              Health
		healthz, livez int
	}{
		{"synced", Health{Running: true, LastSync: now, LastLoop: now}, 200, 200},
		{"recent pending", Health{Running: true, OldestPending: now.Add(-time.Second), LastLoop: now}, 200, 200},
		{"stale pending", Health{Running: true, OldestPending: now.Add(-time.Hour), LastLoop: now.Add(-time.Hour)}, 503, 503},
		{"stale pending, loop alive", Health{Running: true, OldestPending: now.Add(-time.Hour), LastLoop: now}, 503, 200},
		{"node terminating", Health{Running: true, LastLoop: now, NodeTerminating: true}, 503, 200},
		{"not running", Health{}, 200, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(HealthHandler(fixedHealth(tc.h), time.Minute))
			defer srv.Close()
			for path, want := range map[string]int{"/healthz": tc.healthz, "/livez": tc.livez} {
				resp, err := http.Get(srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				var body healthStatus
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if resp.StatusCode != want {
					t.Errorf("%s = %d, want %d", path, resp.StatusCode, want)
				}
				if body.NodeEligible == tc.h.NodeTerminating {
					t.Errorf("%s: nodeEligible = %v", path, body.NodeEligible)
				}
			}
		})
	}
}

func TestEngineHealthTracksPendingEvents(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, NodeName: "n1"}, r)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	if h := e.Health(); h.OldestPending.IsZero() {
		t.Fatal("event not reported as pending")
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h := e.Health()
	if !h.OldestPending.IsZero() || h.LastSync.IsZero() || !h.Running {
		t.Fatalf("after flush: %+v", h)
	}
	e.OnNodeAdd(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{
		Taints: []v1.Taint{{Key: TaintToBeDeletedByClusterAutoscaler, Effect: v1.TaintEffectNoSchedule}}}})
	if !e.Health().NodeTerminating {
		t.Fatal("autoscaler taint not seen")
	}
	if e.Health().Healthy(time.Now(), time.Minute) {
		t.Fatal("terminating node reported healthy")
	}
}

// TestEngineHealthBeforeFirstSync checks that a proxier that never gets
// its initial lists is healthy only within the health timeout, like
// kube-proxy's start-up grace, and reports that nothing is synced yet.
func TestEngineHealthBeforeFirstSync(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond}, r)
	h := e.Health()
	if h.OldestPending.IsZero() || !h.LastSync.IsZero() {
		t.Fatalf("before the first sync: %+v; want the first sync pending and no LastSync", h)
	}
	now := time.Now()
	if !h.Healthy(now, time.Minute) {
		t.Error("unhealthy within the timeout after start")
	}
	if h.Healthy(now.Add(2*time.Minute), time.Minute) {
		t.Error("healthy after the timeout without the initial lists")
	}
	rec := httptest.NewRecorder()
	HealthHandler(e, time.Nanosecond).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"pending":true`) || !strings.Contains(rec.Body.String(), `"lastUpdated":"0001-01-01T00:00:00Z"`) {
		t.Errorf("/healthz without the initial lists after the timeout: %d %s", rec.Code, rec.Body.String())
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if h := e.Health(); !h.OldestPending.IsZero() || h.LastSync.IsZero() {
		t.Fatalf("after the first sync: %+v", h)
	}
}
