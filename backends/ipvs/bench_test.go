package ipvs

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func benchBackend(b *testing.B) *backend {
	b.Helper()
	requireIPVS(b)
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	log := slog.New(slog.NewTextHandler(benchLog{b}, nil))
	be, err := NewBackend(Config{Config: proxier.Config{NetNS: tn.Node1.Path(), Logger: log}}, model.IPv4)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be.(*backend)
}

// BenchmarkFullSync programs n services from nothing (the first sync of
// a process on a clean node).
func BenchmarkFullSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			be := benchBackend(b)
			req := request(model.IPv4, backendtest.ScaleServices(n, 10))
			for b.Loop() {
				b.StopTimer()
				if err := be.Cleanup(b.Context()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := be.Sync(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkResync is the periodic full sync with nothing to change: the
// kernel is read and compared, the table replaced.
func BenchmarkResync(b *testing.B) {
	be := benchBackend(b)
	req := request(model.IPv4, backendtest.ScaleServices(10000, 10))
	if err := be.Sync(b.Context(), req); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := be.Sync(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIncrementalEndpointChange replaces one endpoint of one of
// 10,000 services.
func BenchmarkIncrementalEndpointChange(b *testing.B) {
	be := benchBackend(b)
	svcs := backendtest.ScaleServices(10000, 10)
	if err := be.Sync(b.Context(), request(model.IPv4, svcs)); err != nil {
		b.Fatal(err)
	}
	// UDP-like immediate deletion keeps the number of real servers
	// constant across iterations.
	be.cfg.GracefulTerminationTimeout = -1
	req := request(model.IPv4, svcs)
	req.Full = false
	i := 0
	for b.Loop() {
		s := svcs[i%len(svcs)]
		e := append([]*model.Endpoint{}, s.Targets.Internal...)
		e[0] = eps(netip.AddrPortFrom(netip.MustParseAddr("10.127.255.1"), uint16(1000+i%2)).String())[0]
		svcs[i%len(svcs)] = s.WithTargets(e, e, true)
		req.Targets[s.Port.Name] = svcs[i%len(svcs)].Targets
		req.Changed = map[model.ServicePortName]struct{}{s.Port.Name: {}}
		if err := be.Sync(b.Context(), req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// benchLog writes the backend's log (the full sync's breakdown) to the
// benchmark's log.
type benchLog struct{ b *testing.B }

func (l benchLog) Write(p []byte) (int, error) {
	l.b.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
