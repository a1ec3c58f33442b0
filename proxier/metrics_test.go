package proxier

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

func TestMetricsScrapedOverHTTP(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond, Registerer: reg}, r)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	e.OnServiceAdd(testService("b", "10.96.0.2", 80))
	time.Sleep(time.Millisecond) // trigger times after the start count
	sl := testSlice("a", "a-1", "10.244.1.2")
	sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
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
		"kubeproxy_sync_proxy_rules_service_changes_total 2",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		"kubeproxy_sync_proxy_rules_service_changes_pending 0",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="300"} 1`,
		`proxykit_proxier_info{backend="recorder"} 1`,
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

// kube-proxy's buckets, copied from k8s.io/kubernetes/pkg/proxy/metrics/
// metrics.go at v1.36.3: metrics.ExponentialBuckets(0.001, 2, 15) (lines
// 40, 52, 64 and 293) and the merged linear buckets of
// network_programming_duration_seconds (lines 94-99).
var (
	kubeProxySyncBuckets = []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
		1.024, 2.048, 4.096, 8.192, 16.384}
	kubeProxyProgrammingBuckets = []float64{0.25, 0.5,
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
		21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
		41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
		60, 65, 70, 75, 80, 85, 90, 95, 100, 105, 110, 115,
		120, 150, 180, 210, 240, 270, 300}
)

// kubeProxyFamily is a metric family as kube-proxy defines it.
type kubeProxyFamily struct {
	typ     dto.MetricType
	labels  []string // sorted
	buckets []float64
}

// kubeProxyEngineFamilies are the kube-proxy metrics the engine exposes,
// with kube-proxy's types, labels and buckets (metrics.go, v1.36.3).
var kubeProxyEngineFamilies = map[string]kubeProxyFamily{
	"kubeproxy_sync_proxy_rules_duration_seconds":              {dto.MetricType_HISTOGRAM, []string{"ip_family"}, kubeProxySyncBuckets},
	"kubeproxy_sync_full_proxy_rules_duration_seconds":         {dto.MetricType_HISTOGRAM, []string{"ip_family"}, kubeProxySyncBuckets},
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":      {dto.MetricType_HISTOGRAM, []string{"ip_family"}, kubeProxySyncBuckets},
	"kubeproxy_network_programming_duration_seconds":           {dto.MetricType_HISTOGRAM, []string{"ip_family"}, kubeProxyProgrammingBuckets},
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        {dto.MetricType_GAUGE, []string{"ip_family"}, nil},
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": {dto.MetricType_GAUGE, []string{"ip_family"}, nil},
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      {dto.MetricType_GAUGE, nil, nil},
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":        {dto.MetricType_COUNTER, nil, nil},
	"kubeproxy_sync_proxy_rules_service_changes_pending":       {dto.MetricType_GAUGE, nil, nil},
	"kubeproxy_sync_proxy_rules_service_changes_total":         {dto.MetricType_COUNTER, nil, nil},
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      {dto.MetricType_GAUGE, []string{"ip_family", "traffic_policy"}, nil},
	"kubeproxy_proxy_healthz_total":                            {dto.MetricType_COUNTER, []string{"code"}, nil},
	"kubeproxy_proxy_livez_total":                              {dto.MetricType_COUNTER, []string{"code"}, nil},
	"kubeproxy_conntrack_reconciler_sync_duration_seconds":     {dto.MetricType_HISTOGRAM, []string{"ip_family"}, kubeProxySyncBuckets},
	"kubeproxy_conntrack_reconciler_deleted_entries_total":     {dto.MetricType_COUNTER, []string{"ip_family"}, nil},
}

// checkKubeProxyFamily checks that every series of mf has kube-proxy's
// type, labels (plus extra) and buckets.
func checkKubeProxyFamily(t *testing.T, mf *dto.MetricFamily, want kubeProxyFamily, extra ...string) {
	t.Helper()
	if mf.GetType() != want.typ {
		t.Errorf("%s: type %v, want %v", mf.GetName(), mf.GetType(), want.typ)
	}
	wantLabels := slices.Sorted(slices.Values(append(slices.Clone(want.labels), extra...)))
	for _, m := range mf.GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, l.GetName())
		}
		slices.Sort(labels)
		if !slices.Equal(labels, wantLabels) {
			t.Errorf("%s: labels %v, want %v", mf.GetName(), labels, wantLabels)
		}
		if want.typ != dto.MetricType_HISTOGRAM {
			continue
		}
		var bounds []float64
		for _, b := range m.GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if !slices.Equal(bounds, want.buckets) {
			t.Errorf("%s: buckets %v, want kube-proxy's %v", mf.GetName(), bounds, want.buckets)
		}
	}
}

// gatherFamilies returns reg's metric families by name.
func gatherFamilies(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// metricValue returns the value of the series of mf whose labels include
// labels (name, value pairs), and whether there is one.
func metricValue(mf *dto.MetricFamily, labels ...string) (float64, bool) {
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		default:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestMetricsKubeProxyNames: the engine exposes kube-proxy's metrics
// under kube-proxy's names, types, labels and buckets, with ip_family
// IPv4 and IPv6 as kube-proxy's values, traffic_policy internal and
// external, and, when the proxier has a Name, the label proxier only.
func TestMetricsKubeProxyNames(t *testing.T) {
	for _, name := range []string{"", "pod-net"} {
		t.Run("name="+name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			cfg := Config{Registerer: reg, Name: name, NodeName: "node-a", NoConntrackCleanup: true, NoServiceHealthChecks: true}
			e, err := New(cfg, newRecorder(model.IPv4), newRecorder(model.IPv6))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			// The conntrack hook is off here (it needs a namespace of
			// its own); observe through its metrics as it does.
			e.metrics.conntrackDuration.WithLabelValues("IPv4").Observe(0.003)
			e.metrics.conntrackDeleted.WithLabelValues("IPv4").Add(2)
			svc := testService("a", "10.96.0.1", 80)
			svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			svc.Spec.ClusterIPs = []string{"10.96.0.1", "fd00::1"}
			local := v1.ServiceInternalTrafficPolicyLocal
			svc.Spec.InternalTrafficPolicy = &local
			e.OnServiceAdd(svc)
			time.Sleep(time.Millisecond) // trigger times after the start count
			for _, sl := range []*discoveryv1.EndpointSlice{testSlice("a", "a-4", "10.244.1.2"), testSlice("a", "a-6", "fd00:244::2")} {
				if sl.Name == "a-6" {
					sl.AddressType = discoveryv1.AddressTypeIPv6
				}
				sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
				e.OnEndpointSliceAdd(sl)
			}
			e.OnServiceSynced()
			e.OnEndpointSlicesSynced()
			if ok, ready := e.syncOnce(context.Background(), false); !ok || !ready {
				t.Fatalf("sync: ok %v, ready %v", ok, ready)
			}
			// A partial sync.
			e.OnEndpointSliceUpdate(nil, testSlice("a", "a-4", "10.244.1.3"))
			if ok, ready := e.syncOnce(context.Background(), false); !ok || !ready {
				t.Fatalf("sync: ok %v, ready %v", ok, ready)
			}
			h := HealthHandler(e, time.Minute)
			for _, path := range []string{"/healthz", "/livez"} {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
			}

			var extra []string
			if name != "" {
				extra = []string{"proxier"}
			}
			got := gatherFamilies(t, reg)
			for fam, want := range kubeProxyEngineFamilies {
				mf := got[fam]
				if mf == nil {
					t.Errorf("no %s", fam)
					continue
				}
				checkKubeProxyFamily(t, mf, want, extra...)
				if slices.Contains(want.labels, "ip_family") {
					for _, m := range mf.GetMetric() {
						for _, l := range m.GetLabel() {
							if l.GetName() == "ip_family" && l.GetValue() != "IPv4" && l.GetValue() != "IPv6" {
								t.Errorf("%s: ip_family %q", fam, l.GetValue())
							}
						}
					}
				}
			}
			for _, c := range []struct {
				fam    string
				labels []string
				want   float64
			}{
				{"kubeproxy_sync_proxy_rules_duration_seconds", []string{"ip_family", "IPv4"}, 2},
				{"kubeproxy_sync_proxy_rules_duration_seconds", []string{"ip_family", "IPv6"}, 2},
				{"kubeproxy_sync_full_proxy_rules_duration_seconds", []string{"ip_family", "IPv6"}, 1},
				{"kubeproxy_sync_partial_proxy_rules_duration_seconds", []string{"ip_family", "IPv4"}, 1},
				{"kubeproxy_network_programming_duration_seconds", []string{"ip_family", "IPv4"}, 1},
				{"kubeproxy_network_programming_duration_seconds", []string{"ip_family", "IPv6"}, 1},
				{"kubeproxy_sync_proxy_rules_service_changes_total", nil, 1},
				{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, 3},
				{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "internal", "ip_family", "IPv4"}, 1},
				{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "external", "ip_family", "IPv6"}, 0},
				{"kubeproxy_proxy_healthz_total", []string{"code", "200"}, 1},
				{"kubeproxy_proxy_livez_total", []string{"code", "503"}, 1}, // not running
				{"kubeproxy_conntrack_reconciler_deleted_entries_total", []string{"ip_family", "IPv4"}, 2},
				{"proxykit_proxier_info", []string{"backend", "recorder"}, 1},
			} {
				if v, ok := metricValue(got[c.fam], c.labels...); !ok || v != c.want {
					t.Errorf("%s%v = %v (found %v), want %v", c.fam, c.labels, v, ok, c.want)
				}
			}
			for _, fam := range []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"} {
				for _, ipf := range []string{"IPv4", "IPv6"} {
					if v, _ := metricValue(got[fam], "ip_family", ipf); v < float64(time.Now().Add(-time.Minute).Unix()) {
						t.Errorf("%s{ip_family=%s} = %v, want about now", fam, ipf, v)
					}
				}
			}
		})
	}
}

// TestMetricsNetworkProgramming: the latency of an EndpointSlice change
// is observed in the histogram of the slice's family once that family is
// programmed, and not for changes made before the proxier started (the
// initial list), as in kube-proxy.
func TestMetricsNetworkProgramming(t *testing.T) {
	reg := prometheus.NewRegistry()
	r4, r6 := newRecorder(model.IPv4), newRecorder(model.IPv6)
	e, err := New(Config{Registerer: reg, NoConntrackCleanup: true, NoServiceHealthChecks: true}, r4, r6)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	old := testSlice("a", "a-old", "10.244.1.1")
	old.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}
	e.OnEndpointSliceAdd(old)
	time.Sleep(time.Millisecond)
	trigger := time.Now().Add(time.Millisecond).Format(time.RFC3339Nano)
	for _, sl := range []*discoveryv1.EndpointSlice{testSlice("a", "a-4", "10.244.1.2"), testSlice("a", "a-6", "fd00:244::2")} {
		if sl.Name == "a-6" {
			sl.AddressType = discoveryv1.AddressTypeIPv6
		}
		sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trigger}
		e.OnEndpointSliceAdd(sl)
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	count := func(fam string) float64 {
		v, _ := metricValue(gatherFamilies(t, reg)["kubeproxy_network_programming_duration_seconds"], "ip_family", fam)
		return v
	}
	r6.failNext = 1
	if ok, _ := e.syncOnce(context.Background(), false); ok {
		t.Fatal("sync with a failing IPv6 backend succeeded")
	}
	if n4, n6 := count("IPv4"), count("IPv6"); n4 != 1 || n6 != 0 {
		t.Errorf("after IPv6 failed: %v IPv4 and %v IPv6 observations, want 1 and 0 (the old slice does not count)", n4, n6)
	}
	if ok, _ := e.syncOnce(context.Background(), false); !ok {
		t.Fatal("sync failed")
	}
	if n4, n6 := count("IPv4"), count("IPv6"); n4 != 1 || n6 != 1 {
		t.Errorf("after IPv6 synced: %v IPv4 and %v IPv6 observations, want 1 and 1", n4, n6)
	}
}

// TestMetricsChangesPending: the *_changes_pending gauges count Services
// and EndpointSlice events not yet programmed: they go up with events,
// stay up while syncs fail, and drop to 0 once a sync has programmed
// them (not counting events that arrive later).
func TestMetricsChangesPending(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRecorder(model.IPv4)
	e, err := New(Config{Registerer: reg, NoConntrackCleanup: true, NoServiceHealthChecks: true}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pending := func() (svc, ep float64) {
		got := gatherFamilies(t, reg)
		svc, _ = metricValue(got["kubeproxy_sync_proxy_rules_service_changes_pending"])
		ep, _ = metricValue(got["kubeproxy_sync_proxy_rules_endpoint_changes_pending"])
		return svc, ep
	}
	check := func(what string, svc, ep float64) {
		t.Helper()
		if s, e := pending(); s != svc || e != ep {
			t.Errorf("%s: service changes pending %v, endpoint changes pending %v; want %v, %v", what, s, e, svc, ep)
		}
	}
	sync := func(want bool) {
		t.Helper()
		if ok, ready := e.syncOnce(context.Background(), false); ok != want || !ready {
			t.Fatalf("sync: ok %v, ready %v; want ok %v", ok, ready, want)
		}
	}
	check("start", 0, 0)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	check("one Service added", 1, 0)
	e.OnServiceUpdate(testService("a", "10.96.0.1", 80), testService("a", "10.96.0.1", 81))
	check("the same Service updated", 1, 0)
	e.OnServiceAdd(testService("b", "10.96.0.2", 80))
	check("another Service", 2, 0)
	e.OnEndpointSliceAdd(testSlice("a", "a-1", "10.244.1.2"))
	e.OnEndpointSliceUpdate(nil, testSlice("a", "a-1", "10.244.1.3"))
	check("two slice events", 2, 2)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	sync(true)
	check("after a sync", 0, 0)

	r.failNext = 2 // the partial sync and the full one the engine tries next
	e.OnServiceDelete(testService("b", "10.96.0.2", 80))
	e.OnEndpointSliceDelete(testSlice("a", "a-1", "10.244.1.3"))
	check("a delete of each", 1, 1)
	sync(false)
	check("after a failed sync", 1, 1)
	e.OnServiceUpdate(testService("b", "10.96.0.2", 80), testService("b", "10.96.0.2", 80))
	e.OnEndpointSliceAdd(testSlice("a", "a-2", "10.244.1.4"))
	check("events after the failed sync", 1, 2)
	sync(true)
	check("after the retry", 0, 0)
}

// TestMetricsHealthAnswers: HealthHandler counts the answers to /healthz
// and /livez by status code in the Engine's kubeproxy_proxy_healthz_total
// and kubeproxy_proxy_livez_total, as kube-proxy's healthz server does.
func TestMetricsHealthAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, err := New(Config{Registerer: reg, NoConntrackCleanup: true, NoServiceHealthChecks: true}, newRecorder(model.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	get := func(h http.Handler, path string, want int) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Fatalf("%s = %d, want %d", path, rec.Code, want)
		}
	}
	// The first sync is pending from New: past a nanosecond's timeout
	// /healthz fails; /livez fails while Run does not run.
	expired, fresh := HealthHandler(e, time.Nanosecond), HealthHandler(e, time.Hour)
	get(expired, "/healthz", 503)
	get(expired, "/healthz", 503)
	get(fresh, "/healthz", 200)
	get(fresh, "/livez", 503)
	get(fresh, "/nothing", 404)
	got := gatherFamilies(t, reg)
	for _, c := range []struct {
		fam, code string
		want      float64
	}{
		{"kubeproxy_proxy_healthz_total", "503", 2},
		{"kubeproxy_proxy_healthz_total", "200", 1},
		{"kubeproxy_proxy_livez_total", "503", 1},
	} {
		if v, _ := metricValue(got[c.fam], "code", c.code); v != c.want {
			t.Errorf("%s{code=%q} = %v, want %v", c.fam, c.code, v, c.want)
		}
	}
	if _, ok := metricValue(got["kubeproxy_proxy_livez_total"], "code", "200"); ok {
		t.Error(`kubeproxy_proxy_livez_total{code="200"} counted without a 200 answer`)
	}
	if n := len(got["kubeproxy_proxy_healthz_total"].GetMetric()) + len(got["kubeproxy_proxy_livez_total"].GetMetric()); n != 3 {
		t.Errorf("%d series of answers, want 3", n)
	}
}

// TestBuckets: the bucket helpers give kube-proxy's buckets.
func TestBuckets(t *testing.T) {
	if b := SyncBuckets(); !slices.Equal(b, kubeProxySyncBuckets) {
		t.Errorf("SyncBuckets() = %v", b)
	}
	if b := NetworkProgrammingBuckets(); !slices.Equal(b, kubeProxyProgrammingBuckets) || len(b) != 80 {
		t.Errorf("NetworkProgrammingBuckets() = %v (%d)", b, len(b))
	}
}
