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

// TestPinnedMapsSharedByFamilies: two proxiers, one configured for IPv4
// and one for IPv6, share a cgroup and a PinPath. The second adopts the
// pinned maps of the first one's family as they are, instead of taking
// them for a configuration change and replacing them with one-entry
// maps, which would cut the first one's services off the attached
// programs.
func TestPinnedMapsSharedByFamilies(t *testing.T) {
	pins := bpffs(t)
	x4 := newFixture(t, model.IPv4, func(c *Config) { c.PinPath = pins })
	v4 := vip(model.IPv4, 160)
	web4 := svc("web4", model.TCP, v4, 80, x4.ep(x4.p11, 8080))
	x4.sync([]testSvc{web4})
	x4.reaches(x4.pod3, "tcp", ap(v4, 80), 8080, 3, x4.p11)

	x6 := *x4
	x6.f = model.IPv6
	x6.cfg.Families = []model.IPFamily{model.IPv6}
	x6.b = x6.newBackend()
	v6 := vip(model.IPv6, 160)
	x6.sync([]testSvc{svc("web6", model.TCP, v6, 80, x6.ep(x6.p12, 8080))})
	x6.reaches(x6.pod3, "tcp", ap(v6, 80), 8080, 3, x6.p12)
	// The IPv4 proxier's services, old and new, still work.
	x4.reaches(x4.pod3, "tcp", ap(v4, 80), 8080, 3, x4.p11)
	api4 := svc("api4", model.TCP, v4, 81, x4.ep(x4.p21, 8080))
	x4.sync([]testSvc{web4, api4}, api4.Port.Name)
	x4.reaches(x4.pod3, "tcp", ap(v4, 81), 8080, 3, x4.p21)
	x6.reaches(x6.pod3, "tcp", ap(v6, 80), 8080, 3, x6.p12)
}
