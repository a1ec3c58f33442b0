package ebpf

import (
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/proxier"
)

// BenchmarkRouteSource: the route lookup (netlink, in the node's
// namespace) that decides a node-only frontend of a load-balancer IP
// with source ranges, once per IP and sync with north-south at tc: each
// op asks for a distinct address of the node's default route.
//
// Run with: go test ./backends/ebpf -run='^$' -bench=RouteSource -benchtime=20000x -count=5
func BenchmarkRouteSource(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	be := benchBackend(b, tn.Node1.Path(), emptyCgroup(b), proxier.SchedulerRandom)
	base := netip.MustParseAddr("203.0.113.0").As4()
	i := 0
	c := cputime.Process()
	for b.Loop() {
		a := base
		a[3] = byte(i)
		a[2] = byte(i >> 8)
		i++
		if !be.routeSource(netip.AddrFrom4(a)).IsValid() {
			b.Fatalf("no route source toward %v", netip.AddrFrom4(a))
		}
	}
	b.ReportMetric(float64((cputime.Process()-c)/time.Microsecond)/float64(b.N), "cpu-us/op")
}
