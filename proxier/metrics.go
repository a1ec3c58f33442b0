package proxier

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
)

// metrics are the engine's Prometheus metrics. Those whose meaning is
// kube-proxy's carry its name (subsystem "kubeproxy"), type, labels and
// buckets, as defined in k8s.io/kubernetes/pkg/proxy/metrics/metrics.go
// (v1.36.3), so that existing dashboards and alerts work; the only label
// added is proxier=Config.Name, when set. The others are named
// proxykit_*. docs/METRICS.md lists both.
type metrics struct {
	// ip_family: sync_proxy_rules_duration_seconds,
	// sync_full_proxy_rules_duration_seconds,
	// sync_partial_proxy_rules_duration_seconds.
	syncDuration, fullSyncDuration, partialSyncDuration *prometheus.HistogramVec
	// ip_family: sync_proxy_rules_last_timestamp_seconds and
	// sync_proxy_rules_last_queued_timestamp_seconds.
	lastSync, lastQueued *prometheus.GaugeVec
	// ip_family: network_programming_duration_seconds.
	programming *prometheus.HistogramVec
	// sync_proxy_rules_{service,endpoint}_changes_total and _pending.
	serviceChanges, endpointChanges prometheus.Counter
	servicePending, endpointPending prometheus.Gauge
	// traffic_policy, ip_family.
	noLocalEndpoints *prometheus.GaugeVec
	// code: proxy_healthz_total, proxy_livez_total.
	healthz, livez *prometheus.CounterVec
	// ip_family: conntrack_reconciler_sync_duration_seconds and
	// conntrack_reconciler_deleted_entries_total.
	conntrackDuration *prometheus.HistogramVec
	conntrackDeleted  *prometheus.CounterVec

	// proxykit's own.
	syncFailures *prometheus.CounterVec // ip_family
	conflicts    *prometheus.GaugeVec   // ip_family
	overCapacity *prometheus.GaugeVec   // ip_family
	info         *prometheus.GaugeVec   // backend
}

// SyncBuckets returns kube-proxy's histogram buckets for sync latencies
// (sync_proxy_rules_duration_seconds, its full and partial variants, and
// conntrack_reconciler_sync_duration_seconds): ExponentialBuckets(0.001,
// 2, 15), 1ms to 16.384s. Backends that time syncs of their own use it.
func SyncBuckets() []float64 { return prometheus.ExponentialBuckets(0.001, 2, 15) }

// NetworkProgrammingBuckets returns kube-proxy's buckets of
// network_programming_duration_seconds: 0.25s and 0.5s, every second
// from 1s to 59s, every 5s from 60s to 115s, every 30s from 120s to 300s.
func NetworkProgrammingBuckets() []float64 {
	var b []float64
	for _, r := range []struct {
		start, width float64
		count        int
	}{{0.25, 0.25, 2}, {1, 1, 59}, {60, 5, 12}, {120, 30, 7}} {
		b = append(b, prometheus.LinearBuckets(r.start, r.width, r.count)...)
	}
	return b
}

// KubeProxySubsystem is the subsystem, the prefix of the name, of the
// metrics of the engine and the backends that mean what kube-proxy's of
// the same name mean.
const KubeProxySubsystem = "kubeproxy"

func newMetrics(cfg Config, backend string) (*metrics, error) {
	labels := cfg.MetricLabels(nil)
	histogram := func(name, help string, buckets []float64, vars ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: KubeProxySubsystem, Name: name, Help: help, Buckets: buckets, ConstLabels: labels,
		}, vars)
	}
	gauge := func(name, help string, vars ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: KubeProxySubsystem, Name: name, Help: help, ConstLabels: labels}, vars)
	}
	counter := func(name, help string, vars ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: KubeProxySubsystem, Name: name, Help: help, ConstLabels: labels}, vars)
	}
	m := &metrics{
		syncDuration: histogram("sync_proxy_rules_duration_seconds",
			"Latency in seconds of a sync of one IP family (full or partial, successful or not).", SyncBuckets(), "ip_family"),
		fullSyncDuration: histogram("sync_full_proxy_rules_duration_seconds",
			"Latency in seconds of a full sync: every service port of the family handed to the backend.", SyncBuckets(), "ip_family"),
		partialSyncDuration: histogram("sync_partial_proxy_rules_duration_seconds",
			"Latency in seconds of a partial sync: the changed service ports only.", SyncBuckets(), "ip_family"),
		lastSync: gauge("sync_proxy_rules_last_timestamp_seconds",
			"The last time the family's rules were successfully synced.", "ip_family"),
		lastQueued: gauge("sync_proxy_rules_last_queued_timestamp_seconds",
			"The last time a sync was queued (an event, or a sync asked for).", "ip_family"),
		programming: histogram("network_programming_duration_seconds",
			"From an EndpointSlice change in the control plane (its endpoints.kubernetes.io/last-change-trigger-time) to the change programmed, per IP family of the slice.",
			NetworkProgrammingBuckets(), "ip_family"),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: KubeProxySubsystem,
			Name: "sync_proxy_rules_service_changes_total", Help: "Service events received.", ConstLabels: labels}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: KubeProxySubsystem,
			Name: "sync_proxy_rules_endpoint_changes_total", Help: "EndpointSlice events received.", ConstLabels: labels}),
		servicePending: prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: KubeProxySubsystem,
			Name: "sync_proxy_rules_service_changes_pending", Help: "Services with events not yet programmed.", ConstLabels: labels}),
		endpointPending: prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: KubeProxySubsystem,
			Name: "sync_proxy_rules_endpoint_changes_pending", Help: "EndpointSlice events not yet programmed.", ConstLabels: labels}),
		noLocalEndpoints: gauge("sync_proxy_rules_no_local_endpoints_total",
			"Service ports with a Local traffic policy (internal or external) and no local endpoint, as of the last sync.",
			"traffic_policy", "ip_family"),
		healthz: counter("proxy_healthz_total", "Answers to /healthz, by HTTP status code.", "code"),
		livez:   counter("proxy_livez_total", "Answers to /livez, by HTTP status code.", "code"),
		conntrackDuration: histogram("conntrack_reconciler_sync_duration_seconds",
			"Latency in seconds of a round of stale conntrack flow deletion after a sync.", SyncBuckets(), "ip_family"),
		conntrackDeleted: counter("conntrack_reconciler_deleted_entries_total",
			"Stale conntrack flows deleted.", "ip_family"),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxykit_sync_failures_total", Help: "Failed syncs, by IP family.", ConstLabels: labels,
		}, []string{"ip_family"}),
		conflicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxykit_service_port_conflicts", Help: "Service ports not programmed because they claim an address and port, or a node port, that another service port owns.",
			ConstLabels: labels,
		}, []string{"ip_family"}),
		overCapacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxykit_service_port_over_capacity", Help: "Service ports not programmed because the dataplane is too small for them (an object error matching ErrCapacity, e.g. a full BPF map).",
			ConstLabels: labels,
		}, []string{"ip_family"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxykit_proxier_info", Help: "Always 1; the label backend names the proxier's backend (kube-proxy's /proxyMode).",
			ConstLabels: labels,
		}, []string{"backend"}),
	}
	reg := cfg.Registerer
	err := errors.Join(
		Register(reg, &m.syncDuration, &m.fullSyncDuration, &m.partialSyncDuration, &m.programming, &m.conntrackDuration),
		Register(reg, &m.lastSync, &m.lastQueued, &m.noLocalEndpoints, &m.conflicts, &m.overCapacity, &m.info),
		Register(reg, &m.serviceChanges, &m.endpointChanges),
		Register(reg, &m.servicePending, &m.endpointPending),
		Register(reg, &m.healthz, &m.livez, &m.conntrackDeleted, &m.syncFailures),
	)
	m.info.WithLabelValues(backend).Set(1)
	return m, err
}

// observeSync records a sync attempt of family: its duration, as
// kube-proxy does for every attempt, and a failure or the time of the
// success.
func (m *metrics) observeSync(family string, full bool, d time.Duration, ok bool) {
	m.syncDuration.WithLabelValues(family).Observe(d.Seconds())
	if full {
		m.fullSyncDuration.WithLabelValues(family).Observe(d.Seconds())
	} else {
		m.partialSyncDuration.WithLabelValues(family).Observe(d.Seconds())
	}
	if !ok {
		m.syncFailures.WithLabelValues(family).Inc()
		return
	}
	m.lastSync.WithLabelValues(family).SetToCurrentTime()
}

// queued records that a sync was queued, for every family.
func (m *metrics) queued(families []*family) {
	for _, f := range families {
		m.lastQueued.WithLabelValues(f.backend.Family().String()).SetToCurrentTime()
	}
}

// observeProgramming records the network programming latency of the
// EndpointSlice changes triggered at times, programmed at now.
func (m *metrics) observeProgramming(fam model.IPFamily, times []time.Time, now time.Time) {
	if len(times) == 0 {
		return
	}
	h := m.programming.WithLabelValues(fam.String())
	for _, t := range times {
		h.Observe(now.Sub(t).Seconds())
	}
}

// CountHealthAnswer implements [HealthAnswerCounter]: it counts the
// answers to /healthz and /livez in kubeproxy_proxy_healthz_total and
// kubeproxy_proxy_livez_total.
func (e *Engine) CountHealthAnswer(path string, code int) {
	switch path {
	case "/healthz":
		e.metrics.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
	case "/livez":
		e.metrics.livez.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}
