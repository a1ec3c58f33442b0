package backends_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/cgroup2"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

var vip = netip.MustParseAddr("10.96.0.10")

func objects(pods ...*testnet.Pod) (*v1.Service, *discoveryv1.EndpointSlice) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(testnet.ServerPorts[0])), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, p := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IPv4.String()},
			NodeName: ptr.To(p.Node.Name), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return svc, slice
}

// enterCgroup moves the test process into a cgroup v2 of its own, for
// the eBPF backend's socket programs to see the sockets of every probe,
// and back at the end. Tests that call it must not run in parallel.
func enterCgroup(t *testing.T) string {
	t.Helper()
	if _, err := cgroup2.Mount(); err != nil {
		t.Skipf("needs cgroup v2: %v", err)
	}
	dir, leave, err := cgroup2.Enter("proxykit-backends-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := leave(); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// config is the registry configuration the tests run a backend with in
// node1: IPv4, fast syncs, and for eBPF a cgroup of the test's own and
// node1's pods translated.
func config(t *testing.T, tp *testnet.Topology, name string) backends.Config {
	cfg := backends.Config{Config: proxier.Config{
		NetNS: tp.Node1.Path(), NodeName: testnet.Node1Name, Families: []model.IPFamily{model.IPv4},
		MinSyncInterval: 50 * time.Millisecond, NoServiceHealthChecks: true,
	}}
	if name == "ebpf" {
		cfg.EBPF.CgroupPath = enterCgroup(t)
		for _, p := range tp.Node1.Pods {
			cfg.EBPF.PodNetNS = append(cfg.EBPF.PodNetNS, p.Path())
		}
	}
	return cfg
}

// start runs the named backend in node1 with the objects and waits until
// it has programmed them.
func start(t *testing.T, tp *testnet.Topology, name string, svc *v1.Service, slice *discoveryv1.EndpointSlice) (proxier.Proxier, func()) {
	t.Helper()
	return startWith(t, name, config(t, tp, name), svc, slice)
}

// startWith is start with a configuration of the caller's.
func startWith(t *testing.T, name string, cfg backends.Config, svc *v1.Service, slice *discoveryv1.EndpointSlice) (proxier.Proxier, func()) {
	t.Helper()
	p, err := backends.New(name, cfg)
	if errors.Is(err, proxier.ErrNotSupported) {
		// Not a missing privilege: this kernel lacks what the backend
		// needs (IPVS here); hack/vmtest.sh ./backends/ runs these tests
		// on a kernel that has it.
		t.Skipf("backend %s cannot run on this kernel: %v", name, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(slice)
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	stop := func() { cancel(); <-done; p.Close() }
	t.Cleanup(stop)
	return p, stop
}

// residue lists what the named backend left in the namespace: its
// nftables tables, iptables lines of PROXYKIT chains, IPVS virtual servers
// and the IPVS backend's interface.
func residue(t *testing.T, ns *testnet.NS, backend string) string {
	t.Helper()
	var out []string
	tables := func(name string) {
		tables, err := ns.Exec(t.Context(), "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(tables, "\n") {
			if strings.HasSuffix(l, " "+name) {
				out = append(out, l)
			}
		}
	}
	switch backend {
	case "nftables":
		tables(nftables.DefaultTableName)
	case "ebpf":
		// Without a pin path, the programs go with the proxier: only
		// the north-south table can stay.
		tables(ebpf.DefaultTableName)
	case "ipvs":
		tables(ipvs.DefaultTableName)
		if _, err := ns.Exec(t.Context(), "ip", "link", "show", ipvs.DefaultInterfaceName); err == nil {
			out = append(out, "interface "+ipvs.DefaultInterfaceName)
		}
		h, err := mobyipvs.New(ns.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		svcs, err := h.GetServices()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range svcs {
			out = append(out, fmt.Sprintf("IPVS virtual server %s:%d", s.Address, s.Port))
		}
	case "iptables":
		for _, save := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
			rules, err := ns.Exec(t.Context(), save)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(rules, "\n") {
				if strings.Contains(l, "PROXYKIT") {
					out = append(out, save+": "+l)
				}
			}
		}
	default:
		t.Fatalf("no residue check for backend %s", backend)
	}
	return strings.Join(out, "\n")
}

func TestCleanupAllRemovesEveryBackend(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	for _, name := range backends.Names() {
		t.Run(name, func(t *testing.T) {
			tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
			svc, slice := objects(tp.Pods[0])
			_, stop := start(t, tp, name, svc, slice)
			if r := tp.Pods[0].TCP(netip.AddrPortFrom(vip, 80), 2*time.Second); r.Outcome != testnet.Answered {
				t.Fatalf("service not working before cleanup: %v", r)
			}
			stop() // a crashed or replaced proxier leaves its dataplane
			if residue(t, tp.Node1.NS, name) == "" {
				t.Fatalf("%s left nothing to clean up; the test proves nothing", name)
			}
			if err := backends.CleanupAll(t.Context(), backends.Config{Config: proxier.Config{NetNS: tp.Node1.Path()}}, ""); err != nil {
				t.Fatal(err)
			}
			if r := residue(t, tp.Node1.NS, name); r != "" {
				t.Fatalf("residue after CleanupAll:\n%s", r)
			}
		})
	}
}

// TestMigration switches node1 from one backend to another under
// continuous traffic: the new one syncs, then the old one is cleaned up.
// No probe may fail and nothing of the old backend may remain.
func TestMigration(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	names := backends.Names()
	if len(names) < 2 {
		t.Skipf("only %v registered; migration needs two backends", names)
	}
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			t.Run(from+"-to-"+to, func(t *testing.T) {
				tp := testnet.New(t, testnet.Options{Node1Pods: 2, Node2Pods: 1})
				svc, slice := objects(tp.Pods[0], tp.Pods[1])
				_, stopOld := start(t, tp, from, svc, slice)

				var mu sync.Mutex
				var failures []string
				probes := 0
				quit := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-quit:
							return
						default:
						}
						r := tp.Pods[2].TCP(netip.AddrPortFrom(vip, 80), time.Second)
						mu.Lock()
						probes++
						if r.Outcome != testnet.Answered {
							failures = append(failures, r.String())
						}
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					}
				}()
				start(t, tp, to, svc, slice)
				stopOld()
				if err := backends.CleanupAll(t.Context(), backends.Config{Config: proxier.Config{NetNS: tp.Node1.Path()}}, to); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond)
				close(quit)
				wg.Wait()
				if len(failures) > 0 {
					t.Fatalf("%d of %d probes failed during the switch: %v", len(failures), probes, failures)
				}
				if probes < 10 {
					t.Fatalf("only %d probes ran", probes)
				}
				if r := residue(t, tp.Node1.NS, from); r != "" {
					t.Errorf("residue of %s after switching to %s:\n%s", from, to, r)
				}
				if residue(t, tp.Node1.NS, to) == "" {
					t.Errorf("%s's own rules were removed too", to)
				}
			})
		}
	}
}

// TestRemoveLeftovers checks that a proxier's start removes what another
// backend left behind (its proxier gone), and leaves alone what a live
// proxier of another backend holds.
func TestRemoveLeftovers(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	names := backends.Names()
	for _, old := range names {
		for _, cur := range names {
			if old == cur {
				continue
			}
			t.Run(old+"-then-"+cur, func(t *testing.T) {
				tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
				svc, slice := objects(tp.Pods[0])
				_, stopOld := start(t, tp, old, svc, slice)
				cfg := backends.Config{Config: proxier.Config{NetNS: tp.Node1.Path(), Families: []model.IPFamily{model.IPv4}}}
				// While the old proxier lives, its dataplane stays.
				err := backends.RemoveLeftovers(t.Context(), cfg, cur)
				if !errors.Is(err, ownerlock.ErrHeld) || residue(t, tp.Node1.NS, old) == "" {
					t.Fatalf("with a live %s proxier: %v, residue %q; want it refused and kept", old, err, residue(t, tp.Node1.NS, old))
				}
				stopOld() // gone, as after a switch of backend
				if err := backends.RemoveLeftovers(t.Context(), cfg, cur); err != nil {
					t.Fatal(err)
				}
				if r := residue(t, tp.Node1.NS, old); r != "" {
					t.Fatalf("%s's leftovers after a %s proxier's start:\n%s", old, cur, r)
				}
			})
		}
	}
}
