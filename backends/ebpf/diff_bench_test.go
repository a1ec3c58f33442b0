package ebpf

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// BenchmarkDiffBigService: the user-space work of an incremental sync
// for one endpoint replaced in a service port of n endpoints, without
// the kernel: render (the slot layout keeps every other endpoint in its
// slot) and diffService (the slots to write). It should grow no faster
// than n. Every iteration must find the same two slots to write.
func BenchmarkDiffBigService(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			svc := backendtest.ScaleServices(1, n)[0]
			ids := &idAllocator{}
			prev, err := render(model.IPv4, svc.Port, svc.Targets, nil, ids)
			if err != nil {
				b.Fatal(err)
			}
			e := slices.Clone(svc.Targets.Internal)
			e[0] = eps(netip.AddrPortFrom(scale.ReplacementEndpoint(0), scale.TargetPort))[0]
			t := &proxier.Targets{Internal: e, External: e, HasEndpoints: true}
			for b.Loop() {
				s, err := render(model.IPv4, svc.Port, t, prev, ids)
				if err != nil {
					b.Fatal(err)
				}
				o := &ops{}
				diffService(o, prev, s, map[feKey]bool{})
				if len(o.putBeK) != 2 || len(o.delBe) != 0 {
					b.Fatalf("%d slots written, %d deleted; want 2 and 0", len(o.putBeK), len(o.delBe))
				}
			}
		})
	}
}
