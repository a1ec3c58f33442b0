package iptables

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
)

// ruleMetrics reports the backend's rules as kube-proxy's iptables mode
// does: how many rules it owns per table, and how many restores failed.
type ruleMetrics struct {
	rules    *prometheus.GaugeVec
	failures prometheus.Counter
}

// newRuleMetrics returns the metrics of the family's backend, registered
// with reg when it is not nil. The family is a constant label, so the
// IPv4 and IPv6 backends of one proxier register side by side; a second
// proxier of the same family on the same registry collides and is left
// unregistered, as the engine's own metrics are.
func newRuleMetrics(reg prometheus.Registerer, fam model.IPFamily) *ruleMetrics {
	labels := prometheus.Labels{"ip_family": fam.String()}
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
	if reg != nil {
		_ = reg.Register(m.rules)
		_ = reg.Register(m.failures)
	}
	return m
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
