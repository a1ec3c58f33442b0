package ebpf

import (
	"log/slog"
	"os"
	"runtime"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// BenchmarkFullSyncLarge: the first sync of a process into empty maps
// at 100,000 services of 10 endpoints (issue #22's size), random
// selection, socket programs only. Every iteration starts a new backend
// (its maps: about 250 MB of kernel memory). Reports the CPU time
// (cpu-ms/op) and the heap the sync allocated (alloc-MB/op). Run with
// -benchtime=3x; wrap it in the heavy-run lock of a shared machine.
func BenchmarkFullSyncLarge(b *testing.B) { benchFullSyncLarge(b, "") }

// benchFullSyncLarge runs the first sync of 100,000 services of 10
// endpoints with socket programs only (ns empty) or with the north-south
// plane ns, and reports cpu-ms/op and alloc-MB/op.
func benchFullSyncLarge(b *testing.B, ns NorthSouth) {
	testnet.RequireRoot(b)
	if ns != "" {
		testnet.RequireCommand(b, "nft")
	}
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	const n = 100000
	req := request(model.IPv4, backendtest.ScaleServices(n, 10), nil)
	cfg := Config{
		Config:      proxier.Config{NetNS: tn.Node1.Path(), Families: []model.IPFamily{model.IPv4}},
		CgroupPath:  cg,
		SocketOnly:  ns == "",
		NorthSouth:  ns,
		MaxServices: 1 << 18,
		MaxBackends: 1 << 21,
	}
	// The backend's "full sync" line splits the time into reading the
	// maps, rendering and writing.
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
		c := cputime.Process()
		mustSync(b, x, req)
		cpu += float64((cputime.Process() - c).Milliseconds())
		b.StopTimer()
		runtime.ReadMemStats(&ms1)
		alloc += ms1.TotalAlloc - ms0.TotalAlloc
		closeBench(b, x)
		b.StartTimer()
	}
	b.ReportMetric(cpu/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MB/op")
}
