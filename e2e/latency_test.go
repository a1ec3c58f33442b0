package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Latency measurement parameters.
const (
	latencyChanges = 100
	// latencyMinSync is the daemon's --min-sync-period here. Every API
	// write is spaced from the previous one by more than it, so the rate
	// limiter never holds a change back: what is measured is the pipeline
	// (API server, watch, engine, kernel), the same as with the default
	// 1s at a lower cadence.
	latencyMinSync = 200 * time.Millisecond
	latencyStep    = 5 * time.Millisecond // a new probe every step
)

// TestProgrammingLatency measures network programming latency end to end:
// from the API write to the first successful connection through the
// change, over latencyChanges changes alternating between a new Service
// (with its EndpointSlice, written first) and moving an existing
// Service's only endpoint to another pod. The result is logged on a line
// starting with E2E-LATENCY.
func TestProgrammingLatency(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, envOptions{minSyncPeriod: latencyMinSync})
		n1, n2 := e.tp.Node1, e.tp.Node2
		client := &n1.Pods[2].Host
		pods := []*testnet.Pod{n1.Pods[0], n1.Pods[1], n2.Pods[0], n2.Pods[1]}

		var all, creates, moves, apiCreates []time.Duration
		var svc *v1.Service
		cur := 0
		began := time.Now()
		for i := range latencyChanges {
			var took time.Duration
			var err error
			if i%2 == 0 {
				// A new service: its EndpointSlice goes first, in a
				// sync of its own, so the service's creation is the
				// one change measured.
				name := fmt.Sprintf("lat-%03d", i)
				cur = (cur + 1) % len(pods)
				time.Sleep(latencyMinSync + 50*time.Millisecond)
				e.setEndpoints(name, model.IPv4, pods[cur])
				time.Sleep(latencyMinSync + 50*time.Millisecond)
				start := time.Now()
				svc = e.createService(name)
				apiCreates = append(apiCreates, time.Since(start))
				took, err = firstAnswer(client, clusterIP(t, svc, model.IPv4), start, 10*time.Second, latencyStep)
				creates = append(creates, took)
				if n := e.untranslatedLeft(clusterIP(t, svc, model.IPv4).Addr(), 2*time.Second); n > 0 {
					t.Fatalf("change %d: %d untranslated SYNs to the new cluster IP left in conntrack", i, n)
				}
			} else {
				// The service's only endpoint moves to another pod.
				cur = (cur + 1) % len(pods)
				time.Sleep(latencyMinSync + 50*time.Millisecond)
				start := time.Now()
				e.setEndpoints(svc.Name, model.IPv4, pods[cur])
				took, err = firstAnswer(client, clusterIP(t, svc, model.IPv4), start, 10*time.Second, latencyStep, pods[cur].Name)
				moves = append(moves, took)
			}
			if err != nil {
				t.Fatalf("change %d: %v", i, err)
			}
			all = append(all, took)
		}
		engine := "n/a"
		if v, err := e.proxy.histogramQuantiles("kubeproxy_network_programming_duration_seconds"); err == nil {
			engine = v
		}
		t.Logf("E2E-LATENCY backend=%s changes=%d median=%v p99=%v max=%v | new-service median=%v p99=%v (of which the Create call median=%v p99=%v) | endpoint-move median=%v p99=%v | min-sync-period=%v probe-step=%v wall=%v | engine metric (trigger-time annotation to programmed): %s",
			backend, len(all), pct(all, 50), pct(all, 99), pct(all, 100), pct(creates, 50), pct(creates, 99), pct(apiCreates, 50), pct(apiCreates, 99),
			pct(moves, 50), pct(moves, 99), latencyMinSync, latencyStep, time.Since(began).Round(time.Second), engine)
	})
}

// pct returns the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	i = max(0, min(i, len(s)-1))
	return s[i].Round(100 * time.Microsecond)
}
