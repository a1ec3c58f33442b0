package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Run with: go test ./backends/ebpf -run='^$' -bench=. -benchtime=10x -count=5
//
// The backends run with SocketOnly (the maps alone: the composed
// nftables table costs what backends/nftables's benchmarks say), with
// random and with Maglev selection (sub-benchmarks random/ and
// maglev/; default table size 1021). The services are those of the
// scale benchmarks (backendtest.ScaleServices: the bench tool's
// scale.Services), TCP, 10 endpoints each, every tenth with a node port
// while the node port range lasts (2,768 at 30,000 services).

// selections are the endpoint selections the benchmarks run with.
var selections = []proxier.Scheduler{proxier.SchedulerRandom, proxier.SchedulerMaglev}

// benchBackend returns a SocketOnly IPv4 backend of the node namespace
// nsPath, attaching (at its first sync) to the cgroup cg, picking
// endpoints with sel. It is cleaned up and closed at the end of the
// benchmark, if not before.
func benchBackend(b *testing.B, nsPath, cg string, sel proxier.Scheduler) *backend {
	b.Helper()
	cfg := Config{
		Config:      proxier.Config{NetNS: nsPath, Families: []model.IPFamily{model.IPv4}},
		CgroupPath:  cg,
		SocketOnly:  true,
		MaxBackends: 1 << 19,
		Scheduler:   sel,
	}
	if sel == proxier.SchedulerMaglev {
		cfg.MaxMaglevTables = 1 << 15 // 30,000 services; 136 MB
	}
	be, err := NewBackend(cfg, model.IPv4)
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
	for _, sel := range selections {
		for _, n := range []int{1000, 10000} {
			req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
			b.Run(fmt.Sprintf("%s/first/services=%d", sel, n), func(b *testing.B) {
				var cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					be := benchBackend(b, tn.Node1.Path(), cg, sel)
					runtime.GC()
					b.StartTimer()
					c := cputime.Process()
					mustSync(b, be, req)
					cpu += cputime.Process() - c
					b.StopTimer()
					closeBench(b, be)
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
			})
			b.Run(fmt.Sprintf("%s/resync/services=%d", sel, n), func(b *testing.B) {
				be := benchBackend(b, tn.Node1.Path(), cg, sel)
				mustSync(b, be, req)
				c := cputime.Process()
				for b.Loop() {
					mustSync(b, be, req)
				}
				b.ReportMetric(float64((cputime.Process()-c).Milliseconds())/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// BenchmarkEndpointChange: one endpoint of one service replaced, an
// incremental sync, at 100 and 10,000 services.
func BenchmarkEndpointChange(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	for _, c := range []struct {
		sel proxier.Scheduler
		n   int
	}{{proxier.SchedulerRandom, 100}, {proxier.SchedulerRandom, 10000}, {proxier.SchedulerMaglev, 100}, {proxier.SchedulerMaglev, 10000}} {
		n := c.n
		b.Run(fmt.Sprintf("%s/services=%d", c.sel, n), func(b *testing.B) {
			be := benchBackend(b, tn.Node1.Path(), cg, c.sel)
			svcs := backendtest.ScaleServices(n, 10)
			mustSync(b, be, request(model.IPv4, svcs, nil))
			reqs := replacementRequests(svcs, n/2)
			i := 0
			for b.Loop() {
				mustSync(b, be, reqs[i%2])
				i++
			}
		})
	}
}

// replacementRequests returns two incremental requests of svcs in
// which svcs[at]'s first endpoint is replaced by 10.200.0.1 and by
// 10.200.0.2: applied in turn, each is one endpoint change.
func replacementRequests(svcs []backendtest.Svc, at int) [2]*proxier.SyncRequest {
	base := svcs[at]
	changed := backendtest.Names(base)
	var reqs [2]*proxier.SyncRequest
	for i := range reqs {
		e := slices.Concat(base.Targets.Internal[1:], eps(netip.AddrPortFrom(scale.ReplacementEndpoint(i), scale.TargetPort)))
		svcs[at] = base.WithTargets(e, e, true)
		reqs[i] = request(model.IPv4, svcs, changed)
	}
	svcs[at] = base
	return reqs
}

// BenchmarkConnect: connect() of a UDP socket (no packet is sent) to a
// cluster IP (connectDst), translated by connect4, with 10 and 30,000
// services in the maps; "none" connects to an address that is no
// service. The test process moves into the cgroup for it. With Maglev
// selection the socket is unbound: the table is indexed by its cookie.
// Each size's backend is set up (and closed) in its own sub-benchmark,
// so a -bench pattern that leaves a size out does not sync it.
func BenchmarkConnect(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := newCgroup(b)
	for _, sel := range selections {
		for _, n := range []int{10, 30000} {
			b.Run(fmt.Sprintf("%s/services=%d", sel, n), func(b *testing.B) { benchConnect(b, tn, cg, sel, n) })
		}
	}
}

func benchConnect(b *testing.B, tn *testnet.Topology, cg string, sel proxier.Scheduler, n int) {
	be := benchBackend(b, tn.Node1.Path(), cg, sel)
	svcs := backendtest.ScaleServices(n, 10)
	mustSync(b, be, request(model.IPv4, svcs, nil))
	for _, c := range []struct {
		name string
		dst  [4]byte
	}{{"service", connectDst(svcs).As4()}, {"none", [4]byte{10, 97, 0, 5}}} {
		b.Run(c.name, func(b *testing.B) {
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
}

// BenchmarkConnectScale compares connect() at 10 and at 30,000 services
// on a loaded machine: one backend alternates between the two states
// (a full sync between blocks of connects, not timed) and every block's
// mean is kept, so that load that comes and goes hits both sizes alike.
// It reports the median block of each size and their ratio. Run with
// -benchtime=60000x (30 blocks of each size).
func BenchmarkConnectScale(b *testing.B) {
	testnet.RequireRoot(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := newCgroup(b)
	svcs := backendtest.ScaleServices(30000, 10)
	reqs := [2]*proxier.SyncRequest{request(model.IPv4, svcs[:10], nil), request(model.IPv4, svcs, nil)}
	dst := &unix.SockaddrInet4{Addr: connectDst(svcs).As4(), Port: 80}
	const block = 1000
	for _, sel := range selections {
		b.Run(string(sel), func(b *testing.B) {
			be := benchBackend(b, tn.Node1.Path(), cg, sel)
			var blocks [2][]float64
			err := tn.Node1.Do(func() error {
				i := 0
				var start time.Time
				for b.Loop() {
					if i%block == 0 {
						b.StopTimer()
						if i > 0 {
							blocks[(i/block-1)%2] = append(blocks[(i/block-1)%2], float64(time.Since(start).Nanoseconds())/block)
						}
						mustSync(b, be, reqs[(i/block)%2])
						// The proxier's garbage is collected now, not
						// during the block (the clients of a real node
						// are other processes).
						runtime.GC()
						b.StartTimer()
						start = time.Now()
					}
					fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
					if err != nil {
						return err
					}
					err = unix.Connect(fd, dst)
					unix.Close(fd)
					if err != nil {
						return err
					}
					i++
				}
				if i%block == 0 && i > 0 {
					blocks[(i/block-1)%2] = append(blocks[(i/block-1)%2], float64(time.Since(start).Nanoseconds())/block)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if len(blocks[0]) == 0 || len(blocks[1]) == 0 {
				b.Skipf("%d connects are fewer than two blocks of %d; run with -benchtime=60000x", b.N, block)
			}
			m10, m30k := median(blocks[0]), median(blocks[1])
			b.ReportMetric(m10, "ns/connect@10")
			b.ReportMetric(m30k, "ns/connect@30000")
			b.ReportMetric(m30k/m10, "ratio")
		})
	}
}

// connectDst returns the cluster IP the connect benchmarks dial: that
// of the sixth of svcs (10.96.0.15), among the first ten so that it is
// a service at every size.
func connectDst(svcs []testSvc) netip.Addr { return svcs[5].Port.ClusterIP }

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
