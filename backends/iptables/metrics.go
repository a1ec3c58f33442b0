package iptables

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// ruleMetrics reports the backend's rules as kube-proxy's iptables mode
// does: how many rules it owns per table, and how many restores failed.
type ruleMetrics struct {
	rules    *prometheus.GaugeVec
	failures prometheus.Counter
}

// newRuleMetrics returns the metrics of the family's backend, registered
// with cfg.Registerer when it is not nil. The family is a constant label,
// so the IPv4 and IPv6 backends of one proxier register side by side;
// proxiers on one registry are told apart by cfg.Name (see
// [proxier.Register]).
func newRuleMetrics(cfg proxier.Config, fam model.IPFamily) (*ruleMetrics, error) {
	labels := cfg.MetricLabels(prometheus.Labels{"ip_family": fam.String()})
	m := &ruleMetrics{
		rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "kubeproxy_sync_proxy_rules_iptables_total",
			Help:        "Rules the iptables backend owns in a table, as of its last successful sync.",
			ConstLabels: labels,
		}, []string{"table"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
			Help:        "Syncs of the iptables backend that failed (the previous rules stay in force).",
			ConstLabels: labels,
		}),
	}
	err := errors.Join(proxier.Register(cfg.Registerer, &m.rules), proxier.Register(cfg.Registerer, &m.failures))
	return m, err
}

// observe records the outcome of a sync: st is the state in memory after
// it (nil: unknown, after a failure).
func (m *ruleMetrics) observe(r *renderer, st *state, err error) {
	if st == nil {
		if err != nil {
			m.failures.Inc()
		}
		return
	}
	for t := range numTables {
		n := 0
		fixed, tail := r.fixedChains(t)
		for _, c := range fixed {
			n += len(c.rules)
		}
		n += len(tail)
		for _, tr := range st.svcs[t] {
			n += len(tr.shared)
			for _, c := range tr.chains {
				n += len(c.rules)
			}
		}
		m.rules.WithLabelValues(t.String()).Set(float64(n))
	}
}
