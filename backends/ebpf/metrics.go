package ebpf

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// mapMetrics reports how full the preallocated maps a backend fills are,
// as Cilium's bpf_map_pressure does: a map that fills up makes the
// service ports that do not fit fail (frontends, endpoint slots) or pick
// at random (Maglev tables).
type mapMetrics struct {
	entries  *prometheus.GaugeVec
	pressure *prometheus.GaugeVec
}

// newMapMetrics returns the map gauges, registered with cfg.Registerer
// when it is not nil; proxiers on one registry are told apart by cfg.Name
// (see [proxier.Register]).
func newMapMetrics(cfg proxier.Config) (*mapMetrics, error) {
	labels := cfg.MetricLabels(nil)
	m := &mapMetrics{
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "proxykit_ebpf_map_entries",
			Help:        "Entries the eBPF backend holds in a map (frontends, endpoint slots, Maglev tables) as of its last successful sync.",
			ConstLabels: labels,
		}, []string{"map"}),
		pressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "proxykit_ebpf_map_pressure",
			Help:        "Fill ratio of an eBPF map: entries over the map's configured size (MaxServices, MaxBackends, MaxMaglevTables).",
			ConstLabels: labels,
		}, []string{"map"}),
	}
	return m, proxier.Register(cfg.Registerer, &m.entries, &m.pressure)
}

// observe records the fill of family f's maps in st, of the sizes cfg
// gives.
func (m *mapMetrics) observe(f model.IPFamily, st *state, cfg *Config) {
	svc, be, mag := mapSvc4, mapBe4, mapMag4
	if f == model.IPv6 {
		svc, be, mag = mapSvc6, mapBe6, mapMag6
	}
	for _, x := range []struct {
		name      string
		used, max int
	}{
		{svc, st.nfes, cfg.MaxServices},
		{be, st.nslots, cfg.MaxBackends},
		{mag, st.ntables, cfg.MaxMaglevTables},
	} {
		m.entries.WithLabelValues(x.name).Set(float64(x.used))
		if x.max > 0 {
			m.pressure.WithLabelValues(x.name).Set(float64(x.used) / float64(x.max))
		}
	}
}
