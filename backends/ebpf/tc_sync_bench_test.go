package ebpf

import (
	"log/slog"
	"os"
	"runtime"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// BenchmarkTCFullSyncLarge is BenchmarkFullSyncLarge with NorthSouth
// tc: the first sync of 100,000 services of 10 endpoints (every tenth
// with a node port) into the socket maps and the tc plane's (frontends
// for each service address and node port, endpoint slots, local
// endpoints). Reports cpu-ms/op and alloc-MB/op; the backend's log
// lines split the time between the socket maps and the tc plane. Run
// with -benchtime=2x under the heavy-run lock of a shared machine.
func BenchmarkTCFullSyncLarge(b *testing.B) {
	testnet.RequireRoot(b)
	testnet.RequireCommand(b, "nft")
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	const n = 100000
	req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
	cfg := Config{
		Config:      proxier.Config{NetNS: tn.Node1.Path(), Families: []model.IPFamily{model.IPv4}},
		CgroupPath:  cg,
		NorthSouth:  NorthSouthTC,
		MaxServices: 1 << 18,
		MaxBackends: 1 << 21,
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	var cpu float64
	var alloc uint64
	for b.Loop() {
		b.StopTimer()
		be, err := NewBackend(cfg, model.IPv4)
		if err != nil {
			b.Fatal(err)
		}
		x := be.(*backend)
		runtime.GC()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		b.StartTimer()
		c := cpuTime()
		mustSync(b, x, req)
		cpu += float64((cpuTime() - c).Milliseconds())
		b.StopTimer()
		runtime.ReadMemStats(&ms1)
		alloc += ms1.TotalAlloc - ms0.TotalAlloc
		closeBench(b, x)
		b.StartTimer()
	}
	b.ReportMetric(cpu/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MB/op")
}
