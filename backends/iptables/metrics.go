package iptables

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// ruleMetrics reports the backend's rules as kube-proxy's iptables mode
// does, under its names and labels (k8s.io/kubernetes/pkg/proxy/metrics,
// v1.36.3): the rules it owns and wrote last per table, failed restores,
// and failed partial syncs.
type ruleMetrics struct {
	rules, last               *prometheus.GaugeVec // table
	failures, partialFailures prometheus.Counter
}

// newRuleMetrics returns the metrics of the family's backend, registered
// with cfg.Registerer when it is not nil. The family is the constant label
// ip_family, so the IPv4 and IPv6 backends of one proxier register side
// by side; proxiers on one registry are told apart by cfg.Name (see
// [proxier.Register]).
func newRuleMetrics(cfg proxier.Config, fam model.IPFamily) (*ruleMetrics, error) {
	labels := cfg.MetricLabels(prometheus.Labels{"ip_family": fam.String()})
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: proxier.KubeProxySubsystem, Name: name, Help: help, ConstLabels: labels,
		}, []string{"table"})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: proxier.KubeProxySubsystem, Name: name, Help: help, ConstLabels: labels,
		})
	}
	m := &ruleMetrics{
		rules: gauge("sync_proxy_rules_iptables_total",
			"Rules the iptables backend owns in a table, as of its last successful sync."),
		last: gauge("sync_proxy_rules_iptables_last",
			"Rules the iptables backend wrote (appended or inserted) in a table in its last successful sync."),
		failures: counter("sync_proxy_rules_iptables_restore_failures_total",
			"Runs of the restore program that failed."),
		partialFailures: counter("sync_proxy_rules_iptables_partial_restore_failures_total",
			"Partial syncs (the changes only) that failed; the backend then rewrites everything."),
	}
	err := errors.Join(
		proxier.Register(cfg.Registerer, &m.rules, &m.last),
		proxier.Register(cfg.Registerer, &m.failures, &m.partialFailures),
	)
	return m, err
}

// observe records a successful sync: st is the state in memory after it,
// last describes what it wrote.
func (m *ruleMetrics) observe(r *renderer, st *state, last *inputStats) {
	if st == nil {
		return
	}
	for t := range numTables {
		n := 0
		fixed, tail := r.fixedChains(t)
		for _, c := range fixed {
			n += len(c.rules)
		}
		n += len(tail)
		if t == tNAT && st.fingerprint != "" {
			n++ // the fingerprint rule
		}
		for _, tr := range st.svcs[t] {
			n += len(tr.shared)
			for _, c := range tr.chains {
				n += len(c.rules)
			}
		}
		m.rules.WithLabelValues(t.String()).Set(float64(n))
		m.last.WithLabelValues(t.String()).Set(float64(last.rules[t]))
	}
}
