package proxier

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus metrics. They use kube-proxy's names
// where the meaning is the same, so existing dashboards work, with a
// "backend" label added where it helps.
type metrics struct {
	syncDuration        *prometheus.HistogramVec
	fullSyncDuration    prometheus.Histogram
	partialSyncDuration prometheus.Histogram
	lastSync            prometheus.Gauge
	lastQueued          prometheus.Gauge
	syncFailures        *prometheus.CounterVec
	conflicts           *prometheus.GaugeVec
	serviceChanges      prometheus.Counter
	endpointChanges     prometheus.Counter
	pendingChanges      prometheus.Gauge
	noLocalEndpoints    *prometheus.GaugeVec
	conntrackDeleted    prometheus.Counter
	programming         prometheus.Histogram
}

func newMetrics(cfg Config, backend string) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	labels := cfg.MetricLabels(prometheus.Labels{"backend": backend})
	m := &metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_proxy_rules_duration_seconds", Help: "Sync latency in seconds, by IP family.",
			Buckets: buckets, ConstLabels: labels,
		}, []string{"ip_family"}),
		fullSyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_full_proxy_rules_duration_seconds", Help: "Full sync latency in seconds.",
			Buckets: buckets, ConstLabels: labels,
		}),
		partialSyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_partial_proxy_rules_duration_seconds", Help: "Partial sync latency in seconds.",
			Buckets: buckets, ConstLabels: labels,
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Help: "The last time a sync succeeded.",
			ConstLabels: labels,
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", Help: "The last time a sync was queued.",
			ConstLabels: labels,
		}),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxykit_sync_failures_total", Help: "Failed syncs, by IP family.", ConstLabels: labels,
		}, []string{"ip_family"}),
		conflicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxykit_service_port_conflicts", Help: "Service ports not programmed because they claim an address and port, or a node port, that another service port owns.",
			ConstLabels: labels,
		}, []string{"ip_family"}),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total", Help: "Service events received.", ConstLabels: labels,
		}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total", Help: "EndpointSlice events received.", ConstLabels: labels,
		}),
		pendingChanges: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "proxykit_sync_changes_pending", Help: "Service ports changed but not yet programmed.", ConstLabels: labels,
		}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total", Help: "Service ports with a Local policy and no local endpoint.",
			ConstLabels: labels,
		}, []string{"traffic_policy", "ip_family"}),
		conntrackDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_conntrack_reconciler_deleted_entries_total", Help: "Stale conntrack flows deleted.", ConstLabels: labels,
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubeproxy_network_programming_duration_seconds",
			Help:    "From an EndpointSlice change in the control plane (its last-change-trigger-time) to the change programmed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20), ConstLabels: labels,
		}),
	}
	reg := cfg.Registerer
	err := errors.Join(
		Register(reg, &m.syncDuration),
		Register(reg, &m.fullSyncDuration, &m.partialSyncDuration, &m.programming),
		Register(reg, &m.lastSync, &m.lastQueued, &m.pendingChanges),
		Register(reg, &m.syncFailures),
		Register(reg, &m.conflicts, &m.noLocalEndpoints),
		Register(reg, &m.serviceChanges, &m.endpointChanges, &m.conntrackDeleted),
	)
	return m, err
}

func (m *metrics) observeSync(family string, full bool, d time.Duration, ok bool) {
	if !ok {
		m.syncFailures.WithLabelValues(family).Inc()
		return
	}
	m.syncDuration.WithLabelValues(family).Observe(d.Seconds())
	if full {
		m.fullSyncDuration.Observe(d.Seconds())
	} else {
		m.partialSyncDuration.Observe(d.Seconds())
	}
	m.lastSync.SetToCurrentTime()
}
