package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Run with: go test ./backends/ebpf -run='^$' -bench=. -benchtime=10x -count=5
//
// The backends run with SocketOnly (the maps alone: the composed
// nftables table costs what backends/nftables's benchmarks say).

// scaleServices returns n IPv4 ClusterIP service ports with eps
// endpoints each; every tenth also has a node port.
func scaleServices(n, eps int) []testSvc {
	out := make([]testSvc, 0, n)
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		var e []*model.Endpoint
		for j := range eps {
			k := i*eps + j
			e = append(e, &model.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(64 + k>>16), byte(k >> 8), byte(k)}), 8080), Ready: true, Serving: true})
		}
		sp := &model.ServicePort{Name: spName(fmt.Sprintf("svc-%05d", i), model.TCP), ClusterIP: ip, Port: 80, Protocol: model.TCP}
		if i%10 == 0 && i < 20000 {
			sp.NodePort = uint16(30000 + i/10)
		}
		out = append(out, testSvc{sp: sp, t: &proxier.Targets{Internal: e, External: e, HasEndpoints: true}})
	}
	return out
}

// benchBackend returns a SocketOnly IPv4 backend of the node namespace
// nsPath, attaching (at its first sync) to the cgroup cg. It is cleaned
// up and closed at the end of the benchmark, if not before.
func benchBackend(b *testing.B, nsPath, cg string) *backend {
	b.Helper()
	be, err := NewBackend(Config{
		Config:      proxier.Config{NetNS: nsPath, Families: []model.IPFamily{model.IPv4}},
		CgroupPath:  cg,
		SocketOnly:  true,
		MaxBackends: 1 << 19,
	}, model.IPv4)
	if err != nil {
		b.Fatal(err)
	}
	x := be.(*backend)
	b.Cleanup(func() { closeBench(b, x) })
	return x
}

func closeBench(b *testing.B, x *backend) {
	if x.dp == nil {
		return
	}
	if err := x.Cleanup(context.Background()); err != nil {
		b.Error(err)
	}
	if err := x.Close(); err != nil {
		b.Error(err)
	}
}

// BenchmarkFullSync: the first sync of a process into empty maps, and a
// periodic full resync that finds nothing to change.
func BenchmarkFullSync(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	for _, n := range []int{1000, 10000} {
		req := request(model.IPv4, scaleServices(n, 10), nil)
		b.Run(fmt.Sprintf("first/services=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				be := benchBackend(b, tn.Node1.Path(), cg)
				b.StartTimer()
				mustSync(b, be, req)
				b.StopTimer()
				closeBench(b, be)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("resync/services=%d", n), func(b *testing.B) {
			be := benchBackend(b, tn.Node1.Path(), cg)
			mustSync(b, be, req)
			for b.Loop() {
				mustSync(b, be, req)
			}
		})
	}
}

// BenchmarkEndpointChange: one endpoint of one service replaced, an
// incremental sync, at 100 and 10,000 services.
func BenchmarkEndpointChange(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			be := benchBackend(b, tn.Node1.Path(), cg)
			svcs := scaleServices(n, 10)
			mustSync(b, be, request(model.IPv4, svcs, nil))
			base := svcs[n/2]
			changed := []model.ServicePortName{base.sp.Name}
			var reqs [2]*proxier.SyncRequest
			for i := range reqs {
				e := append([]*model.Endpoint{}, base.t.Internal[1:]...)
				e = append(e, &model.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, 0, byte(i + 1)}), 8080), Ready: true, Serving: true})
				svcs[n/2] = testSvc{sp: base.sp, t: &proxier.Targets{Internal: e, External: e, HasEndpoints: true}}
				reqs[i] = request(model.IPv4, svcs, changed)
			}
			i := 0
			for b.Loop() {
				mustSync(b, be, reqs[i%2])
				i++
			}
		})
	}
}

// BenchmarkConnect: connect() of a UDP socket (no packet is sent) to a
// cluster IP, translated by connect4, with 10 and 30,000 services in the
// maps; "none" connects to an address that is no service. The test
// process moves into the cgroup for it.
func BenchmarkConnect(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := newCgroup(b)
	for _, n := range []int{10, 30000} {
		be := benchBackend(b, tn.Node1.Path(), cg)
		mustSync(b, be, request(model.IPv4, scaleServices(n, 10), nil))
		for _, c := range []struct {
			name string
			dst  [4]byte
		}{{"service", [4]byte{10, 96, 0, 5}}, {"none", [4]byte{10, 97, 0, 5}}} {
			b.Run(fmt.Sprintf("services=%d/%s", n, c.name), func(b *testing.B) {
				err := tn.Node1.Do(func() error {
					for b.Loop() {
						fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
						if err != nil {
							return err
						}
						err = unix.Connect(fd, &unix.SockaddrInet4{Addr: c.dst, Port: 80})
						unix.Close(fd)
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
		closeBench(b, be)
	}
}
