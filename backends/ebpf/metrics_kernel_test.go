package ebpf

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
)

// TestMapMetrics: after each sync the registry holds how many frontends,
// endpoint slots and Maglev tables the family's maps hold, and their fill
// ratio.
func TestMapMetrics(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		reg := prometheus.NewRegistry()
		x := newFixture(t, f, func(c *Config) { c.Registerer = reg })
		gauges := func() map[string]float64 { return backendtest.Metrics(t, reg, "map") }
		svcMap, beMap, magMap := mapSvc4, mapBe4, mapMag4
		if f == model.IPv6 {
			svcMap, beMap, magMap = mapSvc6, mapBe6, mapMag6
		}
		check := func(what string, fes, slots, tables int) {
			t.Helper()
			g := gauges()
			for _, c := range []struct {
				m       string
				n, size int
			}{{svcMap, fes, x.cfg.MaxServices}, {beMap, slots, x.cfg.MaxBackends}, {magMap, tables, DefaultMaxMaglevTablesRandom}} {
				if got := g["proxykit_ebpf_map_entries/"+c.m]; got != float64(c.n) {
					t.Errorf("%s: %s holds %v entries, want %d", what, c.m, got, c.n)
				}
				if got, want := g["proxykit_ebpf_map_pressure/"+c.m], float64(c.n)/float64(c.size); got != want {
					t.Errorf("%s: %s pressure %v, want %v", what, c.m, got, want)
				}
			}
		}
		v := vip(f, 170)
		web := svc("web", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080))
		dns := svc("dns", model.UDP, v, 53, x.ep(x.p11, 8081), x.ep(x.p21, 8081))
		x.sync([]testSvc{web, dns})
		check("two service ports", 2, 5, 0)
		hashed := svc("hashed", model.TCP, v, 81, x.ep(x.p12, 8080))
		hashed.Port.Scheduler = "maglev"
		x.sync([]testSvc{web, dns, hashed}, hashed.Port.Name)
		check("a Maglev one added", 3, 6, 1)
		x.sync([]testSvc{hashed}, web.Port.Name, dns.Port.Name)
		check("two removed", 1, 1, 1)
	})
}
