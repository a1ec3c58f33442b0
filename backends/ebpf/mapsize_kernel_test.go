package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/model"
)

// TestMapsOfUnconfiguredFamily: the preallocated maps of the family the
// proxier is configured for have the configured sizes; those of the
// other family hold one entry, so that an IPv4-only proxier does not
// pay for IPv6 maps it never fills.
func TestMapsOfUnconfiguredFamily(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newFixture(t, f, nil)
		other := model.IPv6
		if f == model.IPv6 {
			other = model.IPv4
		}
		aff := func(f model.IPFamily) *ebpf.Map {
			if f == model.IPv6 {
				return x.b.dp.objs.PkAff6
			}
			return x.b.dp.objs.PkAff4
		}
		check := func(fam model.IPFamily, want [4]uint32) {
			t.Helper()
			svc, be, _, mag := x.b.dp.familyMaps(fam)
			got := [4]uint32{svc.MaxEntries(), be.MaxEntries(), aff(fam).MaxEntries(), mag.MaxEntries()}
			if got != want {
				t.Errorf("%v maps (services, endpoints, affinity, Maglev tables) hold %v entries, want %v", fam, got, want)
			}
		}
		check(f, [4]uint32{uint32(x.cfg.MaxServices), uint32(x.cfg.MaxBackends), uint32(x.cfg.MaxAffinity), DefaultMaxMaglevTablesRandom})
		check(other, [4]uint32{1, 1, 1, 1})
		// The configured family still works.
		v := vip(f, 150)
		x.sync([]testSvc{svc("web", model.TCP, v, 80, x.ep(x.p11, 8080))})
		x.reaches(x.node, "tcp", ap(v, 80), 8080, 3, x.p11)
	})
}
