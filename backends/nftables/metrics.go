package nftables

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// syncMetrics reports the backend's failures as kube-proxy's nftables
// mode does, under its name and labels (k8s.io/kubernetes/pkg/proxy/
// metrics, v1.36.3).
type syncMetrics struct {
	failures prometheus.Counter
}

// newSyncMetrics returns the metrics of the family's backend, registered
// with cfg.Registerer when it is not nil. The family is the constant label
// ip_family, so the IPv4 and IPv6 backends of one proxier register side
// by side; proxiers on one registry are told apart by cfg.Name (see
// [proxier.Register]).
func newSyncMetrics(cfg proxier.Config, fam model.IPFamily) (*syncMetrics, error) {
	m := &syncMetrics{
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem:   proxier.KubeProxySubsystem,
			Name:        "sync_proxy_rules_nftables_sync_failures_total",
			Help:        "Syncs of the nftables backend that failed: the kernel refused the transaction (other than for service ports left out), or the table could not be read.",
			ConstLabels: cfg.MetricLabels(prometheus.Labels{"ip_family": fam.String()}),
		}),
	}
	return m, proxier.Register(cfg.Registerer, &m.failures)
}
