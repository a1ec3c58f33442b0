package iptables

import (
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Run with (10,000 services take minutes):
//
//	go test ./backends/iptables -run='^$' -bench=. -benchtime=1x
//
// PROXYKIT_BENCH_MODE=nft or legacy limits the runs to one flavour. Each
// benchmark programs the node namespace of a fresh testnet topology.

// benchModes are the flavours to benchmark: both, or the one named by
// PROXYKIT_BENCH_MODE.
func benchModes() []Mode {
	if m := Mode(os.Getenv("PROXYKIT_BENCH_MODE")); m != "" {
		return []Mode{m}
	}
	return []Mode{ModeNFT, ModeLegacy}
}

// childCPU returns the CPU time (user and system) the process's finished
// children used so far: the iptables programs' share of a benchmark,
// which the machine's load distorts less than the wall clock.
func childCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timed runs op, adding its children's CPU time to cpu.
func timed(b *testing.B, cpu *time.Duration, op func() error) {
	b.Helper()
	t0 := childCPU()
	if err := op(); err != nil {
		b.Fatal(err)
	}
	*cpu += childCPU() - t0
}

// reportCPU reports cpu per operation.
func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(cpu.Seconds()/float64(b.N), "child-cpu-s/op")
}

// benchBackend returns an IPv4 backend of mode m in the node namespace of
// a fresh topology.
func benchBackend(b *testing.B, m Mode, cfg Config) (*backend, *testnet.Topology) {
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cfg.NetNS, cfg.Mode = tn.Node1.Path(), m
	be, err := NewBackend(cfg, model.IPv4)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be.(*backend), tn
}

// BenchmarkFullSync measures the first sync of services x 10 endpoints in
// a namespace without rules of ours.
func BenchmarkFullSync(b *testing.B) {
	for _, m := range benchModes() {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("mode=%s/services=%d", m, n), func(b *testing.B) {
				be, _ := benchBackend(b, m, Config{})
				req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
				var cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					if err := be.Cleanup(b.Context()); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					timed(b, &cpu, func() error { return be.Sync(b.Context(), req) })
				}
				reportCPU(b, cpu)
				b.ReportMetric(float64(be.last.lines), "lines")
				b.ReportMetric(float64(be.last.bytes)/1e6, "MB")
			})
		}
	}
}

// BenchmarkRender measures the Go side of a complete rewrite of services
// x 10 endpoints, without a kernel: rendering every service port and
// writing the restore input, as one section (legacy) or in sections
// (nft). The iptables programs' share is in BenchmarkFullSync.
func BenchmarkRender(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, layout := range []struct {
			name  string
			chunk int
		}{{"one-section", 0}, {"sections", nftChunk(11*n, false)}} {
			b.Run(fmt.Sprintf("services=%d/%s", n, layout.name), func(b *testing.B) {
				be := offlineBackend(b, model.IPv4, Config{})
				req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
				errs := map[model.ServicePortName]error{}
				var bytes int
				for b.Loop() {
					var want [numTables]map[model.ServicePortName]*tableRules
					for t := range numTables {
						want[t] = make(map[model.ServicePortName]*tableRules, n)
					}
					for name := range req.State.Services {
						rd, _ := be.render(req, name, errs)
						for t := range numTables {
							want[t][name] = rd[t]
						}
					}
					data, _ := joinSections(be.fullSections(want, [numTables][]string{}, layout.chunk, [numTables]jumpMode{jumpsInsert, jumpsInsert}, false))
					bytes = len(data)
				}
				b.ReportMetric(float64(bytes)/1e6, "MB")
			})
		}
	}
}

// BenchmarkFullResync measures a full request over a namespace that
// already holds the same rules, as the periodic resync sends: by default
// it checks and writes the difference (verify); a complete rewrite
// happens once per RewriteInterval (rewrite).
func BenchmarkFullResync(b *testing.B) {
	for _, m := range benchModes() {
		for _, n := range []int{1000, 10000} {
			for _, kind := range []string{"verify", "rewrite"} {
				b.Run(fmt.Sprintf("mode=%s/services=%d/%s", m, n, kind), func(b *testing.B) {
					cfg := Config{}
					if kind == "rewrite" {
						cfg.RewriteInterval = -1
					}
					be, _ := benchBackend(b, m, cfg)
					req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
					if err := be.Sync(b.Context(), req); err != nil {
						b.Fatal(err)
					}
					var cpu time.Duration
					for b.Loop() {
						timed(b, &cpu, func() error { return be.Sync(b.Context(), req) })
					}
					reportCPU(b, cpu)
					b.ReportMetric(float64(be.last.lines), "lines")
				})
			}
		}
	}
}

// BenchmarkOneEndpointChange measures the partial sync that adds one
// endpoint to one service, and reports its restore input's line count.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, m := range benchModes() {
		for _, n := range []int{100, 10000} {
			b.Run(fmt.Sprintf("mode=%s/services=%d", m, n), func(b *testing.B) {
				be, _ := benchBackend(b, m, Config{})
				svcs := backendtest.ScaleServices(n, 10)
				if err := be.Sync(b.Context(), request(model.IPv4, svcs, nil)); err != nil {
					b.Fatal(err)
				}
				base := svcs[n/2]
				changed := backendtest.Names(base)
				svcs[n/2] = base.WithAdded(backendtest.Endpoint("10.200.0.1:8080"))
				grownReq := request(model.IPv4, svcs, changed)
				svcs[n/2] = base
				baseReq := request(model.IPv4, svcs, changed)
				lines := 0
				var cpu time.Duration
				for b.Loop() {
					// Add the endpoint; the timer covers only that.
					timed(b, &cpu, func() error { return be.Sync(b.Context(), grownReq) })
					lines = be.last.lines
					b.StopTimer()
					if err := be.Sync(b.Context(), baseReq); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				reportCPU(b, cpu)
				b.ReportMetric(float64(lines), "lines")
			})
		}
	}
}

// BenchmarkConnect measures a new TCP connection (connect, answer, close)
// from the node through a cluster IP at 10 and 10,000 services: the first
// packet of a connection walks the dispatch chain, which grows with the
// services; the probed service's rule sits somewhere in it (the nft
// flavour's full sync orders dispatch rules by target chain).
func BenchmarkConnect(b *testing.B) {
	for _, m := range benchModes() {
		for _, n := range []int{10, 10000} {
			b.Run(fmt.Sprintf("mode=%s/services=%d", m, n), func(b *testing.B) {
				be, tn := benchBackend(b, m, Config{})
				svcs := backendtest.ScaleServices(n, 10)
				pod := tn.Node1.Pods[0]
				probed := clusterSvc("probed", model.TCP, "10.97.0.1", 80, netip.AddrPortFrom(pod.IPv4, 8080).String())
				if err := be.Sync(b.Context(), request(model.IPv4, svcs, nil)); err != nil {
					b.Fatal(err)
				}
				// Added by a partial sync, its rule would be inserted at
				// the top: add it with a full rewrite instead.
				be.cfg.RewriteInterval = -1
				if err := be.Sync(b.Context(), request(model.IPv4, append(svcs, probed), nil)); err != nil {
					b.Fatal(err)
				}
				dst := netip.MustParseAddrPort("10.97.0.1:80")
				for b.Loop() {
					if r := tn.Node1.TCP(dst, 2*time.Second); r.Outcome != testnet.Answered {
						b.Fatal(r)
					}
				}
			})
		}
	}
}
