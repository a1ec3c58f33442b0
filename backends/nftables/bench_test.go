package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Run with: go test ./backends/nftables -run='^$' -bench=. -benchtime=3x

// scaleServices returns n ClusterIP service ports with eps endpoints
// each; every tenth also has a node port.
func scaleServices(n, eps int) []testSvc {
	out := make([]testSvc, 0, n)
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		var e []*model.Endpoint
		for j := range eps {
			k := i*eps + j
			e = append(e, &model.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(64 + k>>16), byte(k >> 8), byte(k)}), 8080), Ready: true, Serving: true})
		}
		sp := &model.ServicePort{Name: spName(fmt.Sprintf("svc-%05d", i), "http", model.TCP), ClusterIP: ip, Port: 80, Protocol: model.TCP}
		if i%10 == 0 {
			sp.NodePort = uint16(30000 + i/10%2000)
		}
		out = append(out, testSvc{sp: sp, t: &proxier.Targets{Internal: e, External: e, HasEndpoints: true}})
	}
	return out
}

func BenchmarkFullSync(b *testing.B) {
	requireRoot(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := newNS(b)
			be := newTestBackend(b, ns, model.IPv4, Config{})
			req := request(model.IPv4, scaleServices(n, 10), nil)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if err := be.Cleanup(b.Context()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				mustSync(b, be, req)
			}
		})
	}
}

func BenchmarkOneEndpointAdd(b *testing.B) {
	requireRoot(b)
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := newNS(b)
			be := newTestBackend(b, ns, model.IPv4, Config{})
			svcs := scaleServices(n, 10)
			mustSync(b, be, request(model.IPv4, svcs, nil))
			base := svcs[n/2]
			grown := testSvc{sp: base.sp, t: &proxier.Targets{HasEndpoints: true,
				Internal: append(append([]*model.Endpoint{}, base.t.Internal...), ep("10.200.0.1:8080"))}}
			grown.t.External = grown.t.Internal
			changed := names(base)
			svcs[n/2] = grown
			grownReq := request(model.IPv4, svcs, changed)
			svcs[n/2] = base
			baseReq := request(model.IPv4, svcs, changed)
			b.ResetTimer()
			for i := range b.N {
				// Add the endpoint; the timer covers only that.
				mustSync(b, be, grownReq)
				b.StopTimer()
				mustSync(b, be, baseReq)
				if i < b.N-1 {
					b.StartTimer()
				}
			}
		})
	}
}
