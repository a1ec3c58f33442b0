package ebpf

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestTCDSR: with NorthSouthForwarding dsr, a client's flow to a node
// port or a load-balancer IP of node1 whose endpoint runs on node2 goes
// there by direct server return: the endpoint sees the client's address
// (not node1's, as with SNAT), and its replies reach the client over
// node2's own link, not back through node1. node2 runs a backend of its
// own, which unwraps the packets. A service whose
// proxykit.io/forwarding-mode is "snat" is SNATed as before, and with
// hybrid forwarding UDP is. Neither node holds a netfilter rule. node1
// runs tc alone, then XDP in front of it (which passes the flows by
// direct server return to tc; node2 runs tc in both).
func TestTCDSR(t *testing.T) {
	forTCAndXDP(t, testTCDSR)
}

func testTCDSR(t *testing.T, f model.IPFamily, mode NorthSouth) {
	x := &tcFixture{fixture: newFixtureOn(t, f, testnet.Options{ClientToNode2: true}, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = mode
		c.NorthSouthXDPVeth = mode == NorthSouthXDP
		c.NorthSouthForwarding = ForwardingHybrid
	})}
	x.client = x.tn.Client
	if mode == NorthSouthXDP {
		wireLikePeers(t, x.tn.Node1.Path())
	}
	n2 := x.node2Backend()
	remote := x.localEps(8080, x.p21) // p21 runs on node2
	var svcs []testSvc
	for i, proto := range []model.Protocol{model.TCP, model.UDP} {
		s := svc("dsr-"+strings.ToLower(string(proto)), proto, vip(f, byte(10+i)), 80).WithTargets(remote, remote, true)
		s.Port.NodePort = 30080
		s.Port.LoadBalancerIPs = []netip.Addr{extIP(f, 20)}
		svcs = append(svcs, s)
	}
	snat := svc("snat-tcp", model.TCP, vip(f, 12), 80).WithTargets(remote, remote, true)
	snat.Port.NodePort = 30081
	snat.Port.ForwardingMode = "snat"
	svcs = append(svcs, snat)
	x.sync(svcs)
	// node2 holds the same services; there p21 is local.
	onNode2 := make([]testSvc, len(svcs))
	for i, s := range svcs {
		eps := []*model.Endpoint{{Addr: x.ep(x.p21, 8080), Ready: true, Serving: true, NodeName: testnet.Node2Name, Local: true}}
		onNode2[i] = s.WithTargets(eps, eps, true)
	}
	mustSync(t, n2, request(f, onNode2, nil))
	fs, err := x.b.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range fs {
		dsr := strings.Contains(fe.Detail, "direct server return")
		// TCP node port 30080 and load-balancer IP (hybrid: not UDP; not
		// the annotated service's node port 30081).
		want := fe.Protocol == model.TCP && (fe.Port == 30080 || fe.Addr == extIP(f, 20))
		if !slices.Contains([]netip.Addr{vip(f, 10), vip(f, 11), vip(f, 12)}, fe.Addr) && dsr != want {
			t.Errorf("Inspect: %s %s:%d %q, want direct server return %v", fe.Protocol, fe.Addr, fe.Port, fe.Detail, want)
		}
	}
	x.noNetfilter()
	x.noNetfilterOn(&x.tn.Node2.Host)

	client, node1 := x.client.IP(f), x.tn.Node1.IP(f)
	ext := x.tn.Node1.ExternalIP(f)
	const n = 12
	for _, c := range []struct {
		name   string
		proto  string
		to     netip.AddrPort
		source netip.Addr // what the endpoint sees
		direct bool       // replies bypass node1
	}{
		{"node port, TCP", "tcp", ap(ext, 30080), client, true},
		{"load-balancer IP, TCP", "tcp", ap(extIP(f, 20), 80), client, true},
		{"node port, UDP (hybrid: SNAT)", "udp", ap(ext, 30080), node1, false},
		{"annotation snat, TCP", "tcp", ap(ext, 30081), node1, false},
	} {
		fromNode2, viaNode2 := rxPackets(t, x.tn.Node1.NS, testnet.Node2Name), rxPackets(t, x.client.NS, "eth1")
		for range n {
			var r testnet.Result
			if c.proto == "udp" {
				r = x.client.UDP(c.to, 2*time.Second)
			} else {
				r = x.client.TCP(c.to, 2*time.Second)
			}
			if r.Outcome != testnet.Answered || r.Server != x.p21.Name {
				t.Fatalf("%s: client -> %s: %v, want an answer from %s", c.name, c.to, r, x.p21.Name)
			}
			if got := r.Source.Addr().Unmap(); got != c.source {
				t.Fatalf("%s: %s saw source %s, want %s", c.name, r.Server, got, c.source)
			}
		}
		back := rxPackets(t, x.tn.Node1.NS, testnet.Node2Name) - fromNode2
		direct := rxPackets(t, x.client.NS, "eth1") - viaNode2
		t.Logf("%s: %d answers; packets node2 -> node1 %d, node2 -> client %d", c.name, n, back, direct)
		if c.direct && (direct < n || back >= n) {
			t.Errorf("%s: replies went back through node1 (%d packets node2 -> node1, %d node2 -> client for %d flows), want them sent to the client by node2", c.name, back, direct, n)
		}
		if !c.direct && (direct >= n || back < n) {
			t.Errorf("%s: replies went node2 -> client (%d packets; %d node2 -> node1) for %d SNATed flows, want them back through node1", c.name, direct, back, n)
		}
	}
	x.noNetfilter()
	x.noNetfilterOn(&x.tn.Node2.Host)
}

// node2Backend starts a backend in node2's namespace with the fixture's
// north-south settings (its socket programs on a cgroup of their own,
// with no process in it), cleaned up at the end.
func (x *tcFixture) node2Backend() proxier.Backend {
	x.t.Helper()
	cfg := x.cfg
	cfg.NorthSouth, cfg.NorthSouthXDPVeth = NorthSouthTC, false
	cfg.NetNS = x.tn.Node2.Path()
	cfg.NodeName = testnet.Node2Name
	cfg.CgroupPath = emptyCgroup(x.t)
	cfg.PodNetNS = nil
	for _, p := range x.tn.Node2.Pods {
		cfg.PodNetNS = append(cfg.PodNetNS, p.Path())
	}
	b, err := NewBackend(cfg, x.f)
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() {
		if err := b.Cleanup(context.Background()); err != nil {
			x.t.Errorf("node2 Cleanup: %v", err)
		}
		if err := b.Close(); err != nil {
			x.t.Errorf("node2 Close: %v", err)
		}
	})
	return b
}

// rxPackets returns the packets interface dev of ns has received.
func rxPackets(t *testing.T, ns *testnet.NS, dev string) uint64 {
	t.Helper()
	var n uint64
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		n = l.Attrs().Statistics.RxPackets
		return nil
	})
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns.Name(), err)
	}
	return n
}
