package ebpf

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/cilium/ebpf"
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
	// ctEntries and ctPressure are the fill of the tc plane's
	// connection tracking maps (pk_nsct, pk_nsrev), which the programs
	// write: counted in the kernel at a sync, at most every
	// ctCountInterval.
	ctEntries  *prometheus.GaugeVec
	ctPressure *prometheus.GaugeVec
	// xdp counts what the XDP program did, read from the kernel at
	// scrape time (NorthSouthXDP only).
	xdp *xdpCollector
}

// xdpCollector reports proxykit_ebpf_xdp_packets_total from the XDP
// program's per-CPU counters, once a tc plane with XDP gave it read.
type xdpCollector struct {
	desc *prometheus.Desc
	read atomic.Pointer[func() (tx, redirect, pass uint64, err error)]
}

// Describe implements prometheus.Collector.
func (c *xdpCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector: nothing before the XDP
// program is loaded, or when its counters cannot be read.
func (c *xdpCollector) Collect(ch chan<- prometheus.Metric) {
	read := c.read.Load()
	if read == nil {
		return
	}
	tx, redirect, pass, err := (*read)()
	if err != nil {
		return
	}
	for _, x := range []struct {
		action string
		n      uint64
	}{{"tx", tx}, {"redirect", redirect}, {"pass", pass}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(x.n), x.action)
	}
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
		ctEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "proxykit_ebpf_ct_entries",
			Help:        "Flows in a connection tracking map of the tc north-south programs (pk_nsct: client tuples, pk_nsrev: reply tuples), counted in the kernel at a sync, at most every 10 s.",
			ConstLabels: labels,
		}, []string{"map"}),
		ctPressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "proxykit_ebpf_ct_pressure",
			Help:        "Fill ratio of a connection tracking map of the tc north-south programs: entries over its size (MaxSockets). Near 1 the LRU map evicts live flows.",
			ConstLabels: labels,
		}, []string{"map"}),
		xdp: &xdpCollector{desc: prometheus.NewDesc("proxykit_ebpf_xdp_packets_total",
			"Packets the XDP north-south program served, by what it did: tx (translated, sent back out of the interface it came in on), redirect (translated, sent out of another), pass (left to the tc program behind it).",
			[]string{"action"}, labels)},
	}
	if err := proxier.Register(cfg.Registerer, &m.xdp); err != nil {
		return nil, err
	}
	return m, proxier.Register(cfg.Registerer, &m.entries, &m.pressure, &m.ctEntries, &m.ctPressure)
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

// observeCT records that the connection tracking map name of max
// entries holds n.
func (m *mapMetrics) observeCT(name string, n, max int) {
	m.ctEntries.WithLabelValues(name).Set(float64(n))
	if max > 0 {
		m.ctPressure.WithLabelValues(name).Set(float64(n) / float64(max))
	}
}

// ctBatch is how many entries one batch lookup of a connection
// tracking map returns when counting it. Larger batches save syscalls
// but not time: the kernel's copying of each entry dominates
// (BenchmarkCTCount, the same from 256 to 16,384).
const ctBatch = 1024

// entryCounter counts the entries of a hash map with batch lookups
// (kernel 5.6+) into buffers of the map's own key and value sizes, kept
// across calls: counting allocates nothing and does not depend on the
// layout of the keys and values. Not safe for concurrent use.
type entryCounter struct {
	m          *ebpf.Map
	name       string
	keys, vals any
}

// newEntryCounter returns a counter of the entries of m, named name.
func newEntryCounter(m *ebpf.Map, name string) *entryCounter {
	buf := func(size uint32) any {
		t := reflect.SliceOf(reflect.ArrayOf(int(size), reflect.TypeFor[byte]()))
		return reflect.MakeSlice(t, ctBatch, ctBatch).Interface()
	}
	return &entryCounter{m: m, name: name, keys: buf(m.KeySize()), vals: buf(m.ValueSize())}
}

// count returns how many entries the map holds. Entries the programs
// add or remove meanwhile may or may not be counted.
func (c *entryCounter) count() (int, error) {
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := c.m.BatchLookup(&cursor, c.keys, c.vals, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("count %s: %w", c.name, err)
		}
	}
}
