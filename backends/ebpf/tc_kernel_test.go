package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// The tests in this file run the north-south programs at tc
// (bpf/nodeport.c) with real traffic: a client outside the cluster
// reaches node ports, external and load-balancer IPs of node1, which
// runs the backend with NorthSouth tc and no netfilter rule at all.

// tcFixture is a fixture whose backend serves north-south at tc.
type tcFixture struct {
	*fixture
	client *testnet.Host
}

func newTCFixture(t *testing.T, f model.IPFamily, legacy bool) *tcFixture {
	t.Helper()
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "iptables-save")
	x := newFixture(t, f, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = NorthSouthTC
		c.tcLegacy = legacy
	})
	return &tcFixture{fixture: x, client: x.tn.Client}
}

// plane returns the backend's tc plane.
func (x *tcFixture) plane() *tcPlane {
	x.t.Helper()
	tb, ok := x.b.nft.(*tcBackend)
	if !ok {
		x.t.Fatalf("north-south backend is %T, want *tcBackend", x.b.nft)
	}
	return tb.plane
}

// localEps returns endpoints on port of pods, Local when the pod runs
// behind node1.
func (x *tcFixture) localEps(port uint16, pods ...*testnet.Pod) []*model.Endpoint {
	var out []*model.Endpoint
	for _, p := range pods {
		node := testnet.Node2Name
		if p.Node == x.tn.Node1 {
			node = testnet.Node1Name
		}
		out = append(out, &model.Endpoint{Addr: x.ep(p, port), Ready: true, Serving: true, NodeName: node, Local: node == testnet.Node1Name})
	}
	return out
}

// wantSource is the address an endpoint sees for a client flow: the
// client's own for a pod of node1 (or any pod with Local policy), node1's
// address toward node2 for a pod of node2.
func (x *tcFixture) wantSource(server string) netip.Addr {
	if strings.HasPrefix(server, testnet.Node2Name) {
		return x.tn.Node1.IP(x.f)
	}
	return x.client.IP(x.f)
}

// reachesWithSource is reaches from the client, checking the source
// every endpoint saw.
func (x *tcFixture) reachesWithSource(proto string, d netip.AddrPort, port uint16, n int, pods ...*testnet.Pod) {
	x.t.Helper()
	got := map[string]int{}
	for range n {
		var r testnet.Result
		if proto == "udp" {
			r = x.client.UDP(d, 2*time.Second)
		} else {
			r = x.client.TCP(d, 2*time.Second)
		}
		if r.Outcome != testnet.Answered || r.Port != port {
			x.t.Fatalf("client -> %s/%s: %v", d, proto, r)
		}
		ok := false
		for _, p := range pods {
			ok = ok || p.Name == r.Server
		}
		if !ok {
			x.t.Fatalf("client -> %s/%s: answered by %s, want one of %d pods", d, proto, r.Server, len(pods))
		}
		if want := x.wantSource(r.Server); r.Source.Addr().Unmap() != want {
			x.t.Errorf("client -> %s/%s: %s saw source %s, want %s", d, proto, r.Server, r.Source, want)
		}
		got[r.Server]++
	}
	for _, p := range pods {
		if got[p.Name] == 0 {
			x.t.Errorf("client -> %s/%s: %d answers never reached %s: %v", d, proto, n, p.Name, got)
		}
	}
}

// silent requires probes from the client to d to get no answer at all.
func (x *tcFixture) silent(proto string, d netip.AddrPort) {
	x.t.Helper()
	var r testnet.Result
	if proto == "udp" {
		r = x.client.UDP(d, 700*time.Millisecond)
	} else {
		r = x.client.TCP(d, 700*time.Millisecond)
	}
	if !r.Outcome.Silent() {
		x.t.Errorf("client -> %s/%s: %v, want a drop", d, proto, r)
	}
}

// rejected requires probes from the client to d to be rejected (ICMP
// port unreachable). A probe that gets no answer is tried once more,
// and logged: about one IPv6 TCP probe in ten loses its ICMPv6 error on
// the 6.18 development VM, a flake not understood yet.
func (x *tcFixture) rejected(proto string, d netip.AddrPort) {
	x.t.Helper()
	var r testnet.Result
	for try := range 2 {
		if proto == "udp" {
			r = x.client.UDP(d, 2*time.Second)
		} else {
			r = x.client.TCP(d, 2*time.Second)
		}
		if r.Outcome.Rejected() {
			return
		}
		x.t.Logf("client -> %s/%s: %v (try %d), want a reject", d, proto, r, try+1)
	}
	x.t.Errorf("client -> %s/%s: %v, want a reject", d, proto, r)
}

// noNetfilter requires node1's namespace to hold no nftables table and
// no iptables rule.
func (x *tcFixture) noNetfilter() {
	x.t.Helper()
	x.noNetfilterOn(x.node)
}

// noNetfilterOn is noNetfilter on node.
func (x *tcFixture) noNetfilterOn(node *testnet.Host) {
	x.t.Helper()
	ctx := context.Background()
	out, err := node.Exec(ctx, "nft", "list", "ruleset")
	if err != nil {
		x.t.Fatalf("nft list ruleset in %s: %v", node.Name, err)
	}
	if strings.TrimSpace(out) != "" {
		x.t.Errorf("%s holds nftables rules:\n%s", node.Name, out)
	}
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := node.Exec(ctx, cmd)
		if err != nil {
			continue // no legacy or nft iptables to ask
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "-A ") {
				x.t.Errorf("%s holds an iptables rule (%s): %s", node.Name, cmd, l)
			}
		}
	}
}

// forTCAndXDP runs fn with NorthSouth tc, then xdp, each for both
// families.
func forTCAndXDP(t *testing.T, fn func(t *testing.T, f model.IPFamily, mode NorthSouth)) {
	for _, mode := range []NorthSouth{NorthSouthTC, NorthSouthXDP} {
		t.Run(string(mode), func(t *testing.T) {
			forFamilies(t, func(t *testing.T, f model.IPFamily) { fn(t, f, mode) })
		})
	}
}

// extIP returns a documentation address of family f routed to node1 by
// the client (its default route): 203.0.113.x or 2001:db8:ff::x.
func extIP(f model.IPFamily, x byte) netip.Addr {
	if f == model.IPv6 {
		return netip.AddrFrom16([16]byte{0: 0x20, 1: 0x01, 2: 0x0d, 3: 0xb8, 5: 0xff, 15: x})
	}
	return netip.AddrFrom4([4]byte{203, 0, 113, x})
}

// TestTCNorthSouth: with NorthSouth tc, a client outside the cluster
// reaches, over TCP and UDP, IPv4 and IPv6, node ports on node1's
// addresses, an external IP and a load-balancer IP: a local endpoint
// sees the client's address, a remote one node1's; with
// externalTrafficPolicy Local only the local endpoint answers, seeing
// the client; Local without a local endpoint drops; a service without
// endpoints rejects (ICMP port unreachable). node1 holds no netfilter rule all along. Both attach
// paths run: tcx (where the kernel has it) and clsact with cls_bpf.
func TestTCNorthSouth(t *testing.T) {
	forAttachModes(t, testTCNorthSouth)
}

// forAttachModes runs fn for each way the tc programs attach, tcx
// (legacy false, where the kernel has it) and clsact with cls_bpf
// (legacy true), and for each family.
func forAttachModes(t *testing.T, fn func(t *testing.T, f model.IPFamily, legacy bool)) {
	for _, mode := range []struct {
		name   string
		legacy bool
	}{{"tcx", false}, {"clsact", true}} {
		t.Run(mode.name, func(t *testing.T) {
			forFamilies(t, func(t *testing.T, f model.IPFamily) { fn(t, f, mode.legacy) })
		})
	}
}

func testTCNorthSouth(t *testing.T, f model.IPFamily, legacy bool) {
	x := newTCFixture(t, f, legacy)
	both := x.localEps(8080, x.p11, x.p21)
	var svcs []testSvc
	for i, proto := range []model.Protocol{model.TCP, model.UDP} {
		s := svc("np-"+strings.ToLower(string(proto)), proto, vip(f, byte(10+i)), 80).WithTargets(both, both, true)
		s.Port.NodePort = 30080
		s.Port.ExternalIPs = []netip.Addr{extIP(f, 10)}
		s.Port.LoadBalancerIPs = []netip.Addr{extIP(f, 20)}
		svcs = append(svcs, s)

		local := svc("local-"+strings.ToLower(string(proto)), proto, vip(f, byte(20+i)), 80).
			WithTargets(both, x.localEps(8080, x.p11), true)
		local.Port.NodePort = 30090
		local.Port.ExternalPolicy = model.PolicyLocal
		svcs = append(svcs, local)

		remoteOnly := svc("nolocal-"+strings.ToLower(string(proto)), proto, vip(f, byte(30+i)), 80).
			WithTargets(x.localEps(8080, x.p21), nil, true)
		remoteOnly.Port.NodePort = 30091
		remoteOnly.Port.ExternalPolicy = model.PolicyLocal
		svcs = append(svcs, remoteOnly)

		for j, allowed := range []bool{true, false} {
			r := netip.PrefixFrom(x.client.IP(f), x.client.IP(f).BitLen()-8).Masked()
			if !allowed {
				r = netip.PrefixFrom(x.tn.Node2.IP(f), x.tn.Node2.IP(f).BitLen()).Masked()
			}
			lb := svc(fmt.Sprintf("ranges%d-%s", j, strings.ToLower(string(proto))), proto, vip(f, byte(50+2*i+j)), 80).WithTargets(both, both, true)
			lb.Port.LoadBalancerIPs = []netip.Addr{extIP(f, byte(30+j))}
			lb.Port.LoadBalancerSourceRanges = []netip.Prefix{r}
			svcs = append(svcs, lb)
		}

		none := svc("none-"+strings.ToLower(string(proto)), proto, vip(f, byte(40+i)), 80)
		none.Port.NodePort = 30092
		svcs = append(svcs, none)
	}
	x.sync(svcs)
	if p := x.plane(); legacy && !p.legacy {
		t.Fatal("attached with tcx, want clsact")
	} else {
		t.Logf("attached with clsact: %v (kernel %s)", p.legacy, kernelRelease())
	}
	x.noNetfilter()
	ext, internal := x.tn.Node1.ExternalIP(f), x.tn.Node1.IP(f)
	for _, proto := range []string{"tcp", "udp"} {
		for _, a := range []netip.Addr{ext, internal} {
			x.reachesWithSource(proto, ap(a, 30080), 8080, 24, x.p11, x.p21)
		}
		x.reachesWithSource(proto, ap(extIP(f, 10), 80), 8080, 24, x.p11, x.p21)
		x.reachesWithSource(proto, ap(extIP(f, 20), 80), 8080, 24, x.p11, x.p21)
		x.reachesWithSource(proto, ap(ext, 30090), 8080, 8, x.p11)
		x.reachesWithSource(proto, ap(extIP(f, 30), 80), 8080, 24, x.p11, x.p21) // source ranges hold the client
		x.silent(proto, ap(extIP(f, 31), 80))                                    // they do not
		x.silent(proto, ap(ext, 30091))
		x.rejected(proto, ap(ext, 30092))
	}
	// An endpoint change reaches the tc maps at the next sync; a UDP
	// client that keeps its source port follows it (its tracked flow
	// to the removed endpoint is dropped).
	u, err := x.client.UDPSocket(ap(ext, 30080))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if r := u.Query(2 * time.Second); r.Outcome != testnet.Answered {
		t.Fatalf("client UDP socket -> node port: %v", r)
	}
	only12 := x.localEps(8080, x.p12)
	const npTCP, npUDP = 0, 6 // np-tcp and np-udp
	svcs[npTCP] = svcs[npTCP].WithTargets(only12, only12, true)
	svcs[npUDP] = svcs[npUDP].WithTargets(only12, only12, true)
	x.sync(svcs, svcs[npTCP].Port.Name, svcs[npUDP].Port.Name)
	x.reachesWithSource("tcp", ap(ext, 30080), 8080, 4, x.p12)
	if r := u.Query(2 * time.Second); r.Outcome != testnet.Answered || r.Server != x.p12.Name {
		t.Errorf("client UDP socket with a fixed source port -> node port after the endpoint change: %v, want an answer from %s", r, x.p12.Name)
	}
	x.noNetfilter()
	// Without the programs nothing serves the node port: what answered
	// above was the tc datapath.
	if err := x.b.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		var r testnet.Result
		if proto == "udp" {
			r = x.client.UDP(ap(ext, 30080), 700*time.Millisecond)
		} else {
			r = x.client.TCP(ap(ext, 30080), 700*time.Millisecond)
		}
		if r.Outcome == testnet.Answered {
			t.Errorf("after Cleanup, client -> node port/%s: %v, want no answer", proto, r)
		}
	}
}

// TestNodeportMapLayout checks the Go types of the tc maps against the
// BTF of bpf/nodeport.c.
func TestNodeportMapLayout(t *testing.T) {
	spec, err := loadNodeport()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		key, value any
	}{
		{mapNSFe, nsfeKey{}, nsfeVal{}},
		{mapNSBe, beKey{}, nsbeVal{}},
		{mapIfAddr, ifaddrKey{}, [16]byte{}},
		{mapNSLoc, nslocKey{}, uint8(0)},
		{mapNode4, [4]byte{}, uint8(0)},
		{mapNode6, svc6Key{}, uint8(0)},
	} {
		ms := spec.Maps[c.name]
		if ms == nil {
			t.Errorf("no map %s in nodeport_bpfel.o", c.name)
			continue
		}
		if k, v := binary.Size(c.key), binary.Size(c.value); uint32(k) != ms.KeySize || uint32(v) != ms.ValueSize {
			t.Errorf("%s: Go key/value sizes %d/%d, object %d/%d", c.name, k, v, ms.KeySize, ms.ValueSize)
		}
	}
}

// TestTCNodeUDPConnectRefused: with NorthSouth tc, the node's own UDP
// socket connecting to a service without endpoints is refused at
// connect (no program sees the node's packets), while a pod's connect
// succeeds untranslated and its datagram is rejected by the pod veth's
// tc program with ICMP port unreachable, as with kube-proxy.
func TestTCNodeUDPConnectRefused(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newTCFixture(t, f, false)
		x.sync([]testSvc{svc("empty", model.UDP, vip(f, 10), 53)})
		dst := ap(vip(f, 10), 53).String()
		err := x.node.Do(func() error {
			c, err := net.Dial("udp", dst)
			if err == nil {
				c.Close()
			}
			return err
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("node: connect to %s: %v, want ECONNREFUSED", dst, err)
		}
		err = x.pod3.Do(func() error {
			c, err := net.Dial("udp", dst)
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("x")); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			_, err = c.Read(make([]byte, 16))
			return err
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("pod: connect, send and receive to %s: %v, want the receive refused (ICMP port unreachable)", dst, err)
		}
	})
}
