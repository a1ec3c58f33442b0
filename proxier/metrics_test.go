package proxier

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
)

func TestMetricsScrapedOverHTTP(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, Registerer: reg}, r)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	e.OnServiceAdd(testService("b", "10.96.0.2", 80))
	sl := testSlice("a", "a-1", "10.244.1.2")
	sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(-2 * time.Second).Format(time.RFC3339Nano)}
	e.OnEndpointSliceAdd(sl)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_service_changes_total{backend="recorder"} 2`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total{backend="recorder"} 1`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{backend="recorder"} 1`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{backend="recorder",ip_family="IPv4"} 1`,
		`proxykit_sync_changes_pending{backend="recorder"} 0`,
		`kubeproxy_network_programming_duration_seconds_count{backend="recorder"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{backend="recorder",le="1.024"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.Contains(text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
		t.Error("no last sync timestamp")
	}
}

// TestMetricsManyProxiersOneRegistry: proxiers with distinct Names share
// a registry, each with its own series; a successor with the same Name
// shares its predecessor's metrics; a registry that refuses a metric
// fails New instead of leaving the proxier without metrics.
func TestMetricsManyProxiersOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Registerer: reg, NoConntrackCleanup: true, NoServiceHealthChecks: true}
	for _, name := range []string{"pod-net-a", "pod-net-b", "pod-net-a"} {
		c := cfg
		c.Name = name
		e, err := New(c, newRecorder(model.IPv4))
		if err != nil {
			t.Fatalf("proxier %s: %v", name, err)
		}
		e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	changes := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "kubeproxy_sync_proxy_rules_service_changes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "proxier" {
					changes[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if changes["pod-net-a"] != 2 || changes["pod-net-b"] != 1 {
		t.Errorf("service changes per proxier %v, want pod-net-a 2 (two proxiers of that name), pod-net-b 1", changes)
	}

	// A metric of that name with other labels: the registry refuses it.
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "kubeproxy_sync_proxy_rules_service_changes_total", Help: "x"}))
	if _, err := New(Config{Registerer: clash, NoConntrackCleanup: true, NoServiceHealthChecks: true}, newRecorder(model.IPv4)); err == nil {
		t.Error("New succeeded although its metrics could not be registered")
	}
}
