package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestTCIncrementalSync: syncs that are not Full render and write only
// their Changed service ports; after each step of a sequence of changes
// (endpoints added, removed and moved, node ports, load-balancer IPs
// with and without source ranges, policies, affinity, ports deleted)
// the maps hold exactly what a Full sync of the same state writes (the
// Full sync finds nothing to write), and the backend's own record of
// them agrees.
func TestTCIncrementalSync(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newTCFixture(t, f, false)
		tb, ok := x.b.nft.(*tcBackend)
		if !ok {
			t.Fatalf("north-south backend is %T, want *tcBackend", x.b.nft)
		}
		a := svc("a", model.TCP, vip(f, 1), 80, x.ep(x.p11, 8080), x.ep(x.p21, 8080))
		b := svc("b", model.UDP, vip(f, 2), 53, x.ep(x.p12, 5353))
		c := svc("c", model.TCP, vip(f, 3), 443, x.ep(x.p21, 8080)).With(func(sp *model.ServicePort) {
			sp.NodePort = 30443
			sp.LoadBalancerIPs = []netip.Addr{vip(f, 30)}
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(x.tn.Client.IP(f), x.tn.Client.IP(f).BitLen())}
		}).WithAdded(x.localEps(8080, x.p12)...) // a shares this local endpoint from the first step to the second
		cur := map[string]testSvc{"a": a, "b": b, "c": c}
		steps := []struct {
			what string
			set  map[string]*testSvc // nil: deleted
		}{
			{"endpoint added", map[string]*testSvc{"a": ptr(a.WithAdded(x.localEps(8080, x.p12)...))}},
			{"endpoint removed, node port added", map[string]*testSvc{"a": &a, "b": ptr(b.With(func(sp *model.ServicePort) { sp.NodePort = 30053 }))}},
			{"source ranges dropped, affinity", map[string]*testSvc{"b": &b, "c": ptr(c.With(func(sp *model.ServicePort) {
				sp.LoadBalancerSourceRanges = nil
				sp.SessionAffinity = true
				sp.AffinityTimeout = time.Minute
			}))}},
			{"policy Local", map[string]*testSvc{"a": ptr(a.With(func(sp *model.ServicePort) {
				sp.NodePort = 30080
				sp.ExternalPolicy = model.PolicyLocal
			}).WithTargets(a.Targets.Internal, x.localEps(8080, x.p11), true))}},
			{"port deleted", map[string]*testSvc{"b": nil}},
			{"no endpoints, ranges back", map[string]*testSvc{"a": ptr(a.WithTargets(nil, nil, false)), "c": &c}},
			{"Maglev", map[string]*testSvc{"c": ptr(c.With(func(sp *model.ServicePort) { sp.Scheduler = "maglev" }))}},
			{"Maglev endpoints changed", map[string]*testSvc{"c": ptr(c.With(func(sp *model.ServicePort) { sp.Scheduler = "maglev" }).WithAdded(x.localEps(8080, x.p11)...))}},
			{"Maglev no more", map[string]*testSvc{"c": &c}},
			{"deleted and re-added", map[string]*testSvc{"a": nil, "b": &b}},
		}
		state := func() []testSvc {
			var out []testSvc
			for _, n := range []string{"a", "b", "c"} {
				if v, ok := cur[n]; ok {
					out = append(out, v)
				}
			}
			return out
		}
		x.sync(state())
		for _, s := range steps {
			var changed []model.ServicePortName
			for n, v := range s.set {
				if old, ok := cur[n]; ok {
					changed = append(changed, old.Port.Name)
				}
				if v == nil {
					delete(cur, n)
					continue
				}
				cur[n] = *v
				if !slices.Contains(changed, v.Port.Name) {
					changed = append(changed, v.Port.Name)
				}
			}
			x.sync(state(), changed...)
			got, err := tb.readKernel()
			if err != nil {
				t.Fatal(err)
			}
			if !sameNSState(tb, got, tb.st) {
				t.Errorf("%s: the backend's record of the maps differs from them", s.what)
			}
			x.sync(state())
			full, err := tb.readKernel()
			if err != nil {
				t.Fatal(err)
			}
			if !sameNSState(tb, got, full) {
				t.Errorf("%s: the maps after the incremental sync differ from a full sync's: %d/%d frontends, %d/%d slots, %d/%d ranges",
					s.what, len(got.fes), len(full.fes), got.nslots, full.nslots, len(got.ranges), len(full.ranges))
			}
		}
		// The last state still serves: c's load-balancer IP from the client.
		x.answers(x.client, "tcp", ap(vip(f, 30), 443), 8080, 3, x.p21, x.p12)
	})
}

func ptr[T any](v T) *T { return &v }

func sameNSState(tb *tcBackend, a, b *nsState) bool {
	return a != nil && b != nil && maps.Equal(a.fes, b.fes) && sameSlots(a, b) && maps.Equal(a.ranges, b.ranges) &&
		slices.Equal(present(a.locals), present(b.locals)) && maps.Equal(tableSums(tb, a), tableSums(tb, b))
}

// sameSlots says whether a and b hold the same slots.
func sameSlots(a, b *nsState) bool {
	return a.nslots == b.nslots && maps.EqualFunc(a.slots, b.slots, slices.Equal) &&
		maps.EqualFunc(a.gaps, b.gaps, slices.Equal) && len(a.stray) == 0 && len(b.stray) == 0
}

// tableSums returns the fingerprints of st's Maglev tables, built from
// their endpoints where st holds those.
func tableSums(tb *tcBackend, st *nsState) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for id, tab := range st.tables {
		if tab.eps != nil {
			out[id] = tableSum(tb.rows.seed, maglevTable(tab.eps, tb.rows.m, nil))
		} else {
			out[id] = tab.sum
		}
	}
	return out
}

// present returns the endpoints locals counts at least once, sorted.
func present(locals map[nslocKey]int) []string {
	var out []string
	for k, n := range locals {
		if n > 0 {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom16(k.Addr), binary.BigEndian.Uint16(k.Port[:])).String())
		}
	}
	slices.Sort(out)
	return out
}

// BenchmarkTCEndpointChange: one endpoint of one service replaced, an
// incremental sync of a backend with NorthSouth tc (the socket maps and
// the tc plane's), at 100 and 10,000 services. Run with:
//
//	go test ./backends/ebpf -run='^$' -bench=TCEndpointChange -benchtime=20x -count=3
func BenchmarkTCEndpointChange(b *testing.B) {
	testnet.RequireRoot(b)
	testnet.RequireCommand(b, "nft")
	tn := testnet.New(b, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	cg := emptyCgroup(b)
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			be, err := NewBackend(Config{
				Config:      proxier.Config{NetNS: tn.Node1.Path(), Families: []model.IPFamily{model.IPv4}},
				CgroupPath:  cg,
				NorthSouth:  NorthSouthTC,
				MaxBackends: 1 << 19,
			}, model.IPv4)
			if err != nil {
				b.Fatal(err)
			}
			x := be.(*backend)
			b.Cleanup(func() { closeBench(b, x) })
			svcs := backendtest.ScaleServices(n, 10)
			mustSync(b, x, request(model.IPv4, svcs, nil))
			reqs := replacementRequests(svcs, n/2)
			i := 0
			c := cputime.Process()
			for b.Loop() {
				mustSync(b, x, reqs[i%2])
				i++
			}
			b.ReportMetric(float64((cputime.Process()-c).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// TestTCMapFull: with MaxBackends 3 a service port whose endpoint slots
// do not fit the tc plane's pk_nsbe is left out with an ObjectError
// naming the map and its Config field (matching ErrCapacity); the one
// that fits is programmed and served, and the one left out is
// programmed once it fits. Before, the whole sync failed: nothing new
// was programmed for any service while one did not fit.
func TestTCMapFull(t *testing.T) {
	f := model.IPv4
	testnet.RequireCommand(t, "nft")
	x := &tcFixture{fixture: newFixture(t, f, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = NorthSouthTC
		c.MaxBackends = 3 // pk_nsbe holds 3 slots (one family); the socket maps too
	})}
	x.client = x.tn.Client
	small := svc("a-small", model.TCP, vip(f, 1), 80, x.ep(x.p21, 8080)).With(func(sp *model.ServicePort) { sp.NodePort = 30080 })
	big := svc("b-big", model.TCP, vip(f, 2), 80, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080)).With(func(sp *model.ServicePort) { sp.NodePort = 30081 })
	check := func(err error, want bool) {
		t.Helper()
		var oe *proxier.ObjectError
		if !want {
			if err != nil {
				t.Fatalf("sync: %v", err)
			}
			return
		}
		if !proxier.OnlyObjectErrors(err) || !errors.As(err, &oe) || oe.Service != big.Port.Name ||
			!strings.Contains(err.Error(), mapNSBe) || !strings.Contains(err.Error(), "MaxBackends") || !errors.Is(err, proxier.ErrCapacity) {
			t.Fatalf("sync: %v; want only an ObjectError for %s naming %s and MaxBackends, matching ErrCapacity", err, big.Port.Name, mapNSBe)
		}
	}
	check(x.b.Sync(t.Context(), request(f, []testSvc{small, big}, nil)), true)
	x.answers(x.client, "tcp", ap(x.tn.Node1.ExternalIP(f), 30080), 8080, 3, x.p21)
	// An incremental sync that moves small's endpoint keeps big out.
	small2 := small.WithTargets(x.localEps(8080, x.p12), x.localEps(8080, x.p12), true)
	check(x.b.Sync(t.Context(), request(f, []testSvc{small2, big}, backendtest.Names(small2, big))), true)
	x.answers(x.client, "tcp", ap(x.tn.Node1.ExternalIP(f), 30080), 8080, 3, x.p12)
	// Without its node port and with one endpoint, big fits (3 slots).
	big2 := svc("b-big", model.TCP, vip(f, 2), 80, x.ep(x.p21, 8080))
	check(x.b.Sync(t.Context(), request(f, []testSvc{small2, big2}, backendtest.Names(big2))), false)
	if n := x.b.nft.(*tcBackend).st.nslots; n != 3 {
		t.Errorf("the maps hold %d slots, want 3", n)
	}
}
