package ebpf

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCConntrackMetrics: with NorthSouth tc, the flows a client opens
// to a node port show in proxykit_ebpf_ct_entries (pk_nsct and
// pk_nsrev, counted at a sync) and proxykit_ebpf_ct_pressure (over
// MaxSockets): none before the first flow, at least one per flow after,
// and as many as the kernel's map holds. A sync within ctCountInterval
// of the last count does not count again.
func TestTCConntrackMetrics(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		reg := prometheus.NewRegistry()
		testnet.RequireCommand(t, "nft")
		testnet.RequireCommand(t, "iptables-save")
		fx := newFixture(t, f, func(c *Config) {
			c.SocketOnly = false
			c.NorthSouth = NorthSouthTC
			c.Registerer = reg
		})
		x := &tcFixture{fixture: fx, client: fx.tn.Client}
		both := x.localEps(8080, x.p11, x.p21)
		var svcs []testSvc
		for i, proto := range []model.Protocol{model.TCP, model.UDP} {
			s := svc("np-"+strings.ToLower(string(proto)), proto, vip(f, byte(10+i)), 80).WithTargets(both, both, true)
			s.Port.NodePort = 30080
			svcs = append(svcs, s)
		}
		gauge := func(name string) float64 {
			return backendtest.Metrics(t, reg, "map")["proxykit_ebpf_ct_entries/"+name]
		}
		check := func(what string, min int) {
			t.Helper()
			g := backendtest.Metrics(t, reg, "map")
			for _, m := range []*ebpf.Map{x.plane().objs.PkNsct, x.plane().objs.PkNsrev} {
				name := mapName(m)
				n, ok := g["proxykit_ebpf_ct_entries/"+name]
				if !ok {
					t.Fatalf("%s: no proxykit_ebpf_ct_entries{map=%q} in %v", what, name, g)
				}
				// No packet crossed node1 since the sync: the gauge is
				// what the map holds now.
				if have := iterateCount(t, m); n != float64(have) {
					t.Errorf("%s: %s: gauge %v, map holds %d", what, name, n, have)
				}
				t.Logf("%s: %s holds %v flows", what, name, n)
				if n < float64(min) {
					t.Errorf("%s: %s: gauge %v, want at least %d", what, name, n, min)
				}
				if min == 0 && n != 0 {
					t.Errorf("%s: %s: gauge %v before any flow, want 0", what, name, n)
				}
				if got, want := g["proxykit_ebpf_ct_pressure/"+name], n/float64(x.cfg.MaxSockets); got != want {
					t.Errorf("%s: %s: pressure %v, want %v (%v / MaxSockets %d)", what, name, got, want, n, x.cfg.MaxSockets)
				}
			}
		}
		start := time.Now()
		x.sync(svcs)
		check("first sync", 0)
		// Flows from sockets open at the same time, so that no two share
		// a source port (and a tracking entry).
		const flows = 12
		ext := ap(x.tn.Node1.ExternalIP(f), 30080)
		for range flows {
			c, err := x.client.DialTCP(ext, 2*time.Second)
			if err != nil {
				t.Fatalf("client -> %s/tcp: %v", ext, err)
			}
			defer c.Close()
			u, err := x.client.UDPSocket(ext)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			if r := u.Query(2 * time.Second); r.Outcome != testnet.Answered {
				t.Fatalf("client -> %s/udp: %v", ext, r)
			}
		}
		// Within the interval the next sync does not count.
		x.sync(svcs)
		if n := gauge(mapNSCt); n != 0 && time.Since(start) < ctCountInterval {
			t.Errorf("a sync right after the first counted again: %s gauge %v, want 0 until %v passed", mapNSCt, n, ctCountInterval)
		}
		x.plane().mu.Lock()
		x.plane().ctEvery = 0
		x.plane().mu.Unlock()
		// Let a late retransmission or reply settle before the count.
		time.Sleep(100 * time.Millisecond)
		x.sync(svcs)
		check("after the flows", 2*flows)
	})
}

// iterateCount counts the entries of m key by key, independently of
// the batch lookups of entryCounter.
func iterateCount(tb testing.TB, m *ebpf.Map) int {
	tb.Helper()
	var k, v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		tb.Fatalf("iterate %s: %v", mapName(m), err)
	}
	return n
}

// BenchmarkCTCount measures counting a full connection tracking map
// (pk_nsct at its default size, MaxSockets 65,536) as every sync does
// for pk_nsct and pk_nsrev: batch lookups into reused buffers
// (entryCounter), and for comparison key by key (MapIterator).
//
//	go test -run '^$' -bench CTCount ./backends/ebpf/
func BenchmarkCTCount(b *testing.B) {
	testnet.RequireRoot(b)
	spec, err := loadNodeport()
	if err != nil {
		b.Fatal(err)
	}
	ms := spec.Maps[mapNSCt].Copy()
	ms.MaxEntries = DefaultMaxSockets
	ms.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(ms)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	keys := make([][]byte, ms.MaxEntries)
	vals := make([][]byte, ms.MaxEntries)
	for i := range keys {
		keys[i] = make([]byte, ms.KeySize)
		binary.LittleEndian.PutUint32(keys[i], uint32(i))
		vals[i] = make([]byte, ms.ValueSize)
	}
	for i := range keys {
		if err := m.Put(keys[i], vals[i]); err != nil {
			b.Fatalf("fill %s: entry %d: %v", mapNSCt, i, err)
		}
	}
	c := newEntryCounter(m, mapNSCt)
	want, err := c.count()
	if err != nil {
		b.Fatal(err)
	}
	if have := iterateCount(b, m); have != want || want < int(ms.MaxEntries)*9/10 {
		b.Fatalf("counted %d entries in batches, %d one by one, of %d put", want, have, ms.MaxEntries)
	}
	b.Run("batch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if n, err := c.count(); err != nil || n != want {
				b.Fatalf("count: %d, %v; want %d", n, err, want)
			}
		}
		b.ReportMetric(float64(want), "entries")
	})
	b.Run("iterate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if n := iterateCount(b, m); n != want {
				b.Fatalf("iterate: %d, want %d", n, want)
			}
		}
		b.ReportMetric(float64(want), "entries")
	})
}
