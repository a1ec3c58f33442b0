package backendtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics gathers g and returns the value of every gauge and counter,
// keyed by the metric's name, followed by "/" and its label label when it
// has one (e.g. "kubeproxy_sync_proxy_rules_iptables_total/nat").
func Metrics(tb testing.TB, g prometheus.Gatherer, label string) map[string]float64 {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					key += "/" + l.GetValue()
				}
			}
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}
