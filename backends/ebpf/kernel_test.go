package ebpf

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// The tests in this file run the socket programs for real: a testnet
// topology, a cgroup of the test's own holding the test process, and a
// backend with SocketOnly set, so that no nftables rule could serve the
// traffic instead: every answer through a service address went through
// the programs.

// fixture is one family's world: topology, cgroup, backend.
type fixture struct {
	t    *testing.T
	f    model.IPFamily
	tn   *testnet.Topology
	cg   string
	cfg  Config
	b    *backend
	node *testnet.Host
	pod3 *testnet.Host
	p11  *testnet.Pod
	p12  *testnet.Pod
	p21  *testnet.Pod
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func newFixture(t *testing.T, f model.IPFamily, mod func(*Config)) *fixture {
	t.Helper()
	return newFixtureOn(t, f, testnet.Options{}, mod)
}

// newFixtureOn is newFixture on a topology built with opts.
func newFixtureOn(t *testing.T, f model.IPFamily, opts testnet.Options, mod func(*Config)) *fixture {
	t.Helper()
	testnet.RequireRoot(t)
	tn := testnet.New(t, opts)
	x := &fixture{
		t: t, f: f, tn: tn,
		cg:   newCgroup(t),
		node: &tn.Node1.Host,
		pod3: &tn.Node1.Pods[2].Host,
		p11:  tn.Node1.Pods[0],
		p12:  tn.Node1.Pods[1],
		p21:  tn.Node2.Pods[0],
	}
	x.cfg = Config{
		Config: proxier.Config{
			NetNS:    tn.Node1.Path(),
			NodeName: testnet.Node1Name,
			Families: []model.IPFamily{f},
			Logger:   testLogger(t),
		},
		CgroupPath:  x.cg,
		PodNetNS:    podPaths(tn),
		SocketOnly:  true,
		MaxServices: 1024,
		MaxBackends: 4096,
		MaxAffinity: 1024,
		MaxSockets:  1024,
	}
	if mod != nil {
		mod(&x.cfg)
	}
	x.b = x.newBackend()
	return x
}

// newBackend builds a backend of the fixture's configuration, cleaned up
// and closed at the end of the test.
func (x *fixture) newBackend() *backend {
	x.t.Helper()
	be, err := NewBackend(x.cfg, x.f)
	if err != nil {
		x.t.Fatal(err)
	}
	b := be.(*backend)
	x.t.Cleanup(func() {
		if b.dp != nil {
			if err := b.Cleanup(context.Background()); err != nil {
				x.t.Errorf("Cleanup: %v", err)
			}
		}
		if err := b.Close(); err != nil {
			x.t.Errorf("Close: %v", err)
		}
	})
	return b
}

func (x *fixture) ep(p *testnet.Pod, port uint16) netip.AddrPort { return ap(p.IP(x.f), port) }

func (x *fixture) sync(svcs []testSvc, changed ...model.ServicePortName) {
	x.t.Helper()
	var ch []model.ServicePortName
	if len(changed) > 0 {
		ch = changed
	}
	mustSync(x.t, x.b, request(x.f, svcs, ch))
}

// answers requires n TCP (or UDP) probes to be answered by one of pods
// on port and returns the answers per pod.
func (x *fixture) answers(from *testnet.Host, proto string, d netip.AddrPort, port uint16, n int, pods ...*testnet.Pod) map[string]int {
	x.t.Helper()
	got := map[string]int{}
	for range n {
		var r testnet.Result
		if proto == "udp" {
			r = from.UDP(d, 2*time.Second)
		} else {
			r = from.TCP(d, 2*time.Second)
		}
		ok := r.Outcome == testnet.Answered && r.Port == port && slices.ContainsFunc(pods, func(p *testnet.Pod) bool { return p.Name == r.Server })
		if !ok {
			x.t.Fatalf("%s -> %s/%s: %v", from.Name, d, proto, r)
		}
		got[r.Server]++
	}
	return got
}

func (x *fixture) reaches(from *testnet.Host, proto string, d netip.AddrPort, port uint16, n int, pods ...*testnet.Pod) {
	x.t.Helper()
	got := x.answers(from, proto, d, port, n, pods...)
	for _, p := range pods {
		if got[p.Name] == 0 {
			x.t.Errorf("%s -> %s/%s: %d answers never reached %s: %v", from.Name, d, proto, n, p.Name, got)
		}
	}
}

// unconnectedUDP sends a datagram with sendto from an unconnected socket
// and returns the reply and the address recvfrom reported.
func unconnectedUDP(h *testnet.Host, dst netip.AddrPort) (testnet.Reply, netip.AddrPort, error) {
	var r testnet.Reply
	var from netip.AddrPort
	err := h.Do(func() error {
		network := "udp4"
		if dst.Addr().Is6() {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.WriteToUDPAddrPort([]byte("tok"), dst); err != nil {
			return err
		}
		buf := make([]byte, 512)
		n, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		from = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		r, err = testnet.ParseReply(string(buf[:n]))
		return err
	})
	return r, from, err
}

func forFamilies(t *testing.T, fn func(t *testing.T, f model.IPFamily)) {
	for _, f := range fams() {
		t.Run(f.String(), func(t *testing.T) { fn(t, f) })
	}
}

// TestClusterIP: TCP, connected UDP and unconnected UDP to a cluster IP
// from the node and from a pod reach a local and a remote endpoint;
// getpeername and recvfrom show the service address; the endpoint sees
// the client's own address (no NAT).
func TestClusterIP(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newFixture(t, f, nil)
		v := vip(f, 10)
		tcp := svc("web", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p21, 8080))
		udp := svc("dns", model.UDP, v, 53, x.ep(x.p11, 8081), x.ep(x.p21, 8081))
		x.sync([]testSvc{tcp, udp})
		if got := attachedPrograms(t, x.cg); len(got) != len(hooks()) {
			t.Fatalf("%d programs attached to the cgroup, want %d", len(got), len(hooks()))
		}
		for _, from := range []*testnet.Host{x.node, x.pod3} {
			x.reaches(from, "tcp", ap(v, 80), 8080, 20, x.p11, x.p21)
			x.reaches(from, "udp", ap(v, 53), 8081, 20, x.p11, x.p21)
		}
		// The pod's own address reaches the endpoint: no masquerade.
		r := x.pod3.TCP(ap(v, 80), 2*time.Second)
		if r.Outcome != testnet.Answered || r.Source.Addr() != x.pod3.IP(f) {
			t.Errorf("pod3 -> %s: %v; want an answer seeing source %s", ap(v, 80), r, x.pod3.IP(f))
		}
		// getpeername shows the service address.
		for _, from := range []*testnet.Host{x.node, x.pod3} {
			c, err := from.DialTCP(ap(v, 80), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != ap(v, 80) {
				t.Errorf("%s: getpeername says %s, want %s", from.Name, got, ap(v, 80))
			}
			c.Close()
		}
		// Unconnected UDP: sendto is translated, recvfrom shows the
		// service address.
		seen := map[string]bool{}
		for range 20 {
			r, src, err := unconnectedUDP(x.pod3, ap(v, 53))
			if err != nil {
				t.Fatalf("unconnected UDP to %s: %v", ap(v, 53), err)
			}
			if src != ap(v, 53) {
				t.Fatalf("recvfrom says the answer came from %s, want %s", src, ap(v, 53))
			}
			seen[r.Server] = true
		}
		if !seen[x.p11.Name] || !seen[x.p21.Name] {
			t.Errorf("unconnected UDP reached %v, want both endpoints", seen)
		}
	})
}

// TestIPv4MappedIPv6Socket: an IPv6 socket connecting to an IPv4-mapped
// cluster IP is translated with the IPv4 maps, and getpeername shows the
// mapped service address.
func TestIPv4MappedIPv6Socket(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	v := vip(model.IPv4, 11)
	x.sync([]testSvc{svc("web", model.TCP, v, 80, x.ep(x.p11, 8080))})
	mapped := netip.AddrPortFrom(netip.AddrFrom16(v.As16()), 80)
	// Go's net package refuses IPv4-mapped addresses on tcp6: use the
	// system calls.
	var peer netip.AddrPort
	var reply string
	err := x.pod3.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		tv := unix.Timeval{Sec: 2}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: mapped.Addr().As16(), Port: 80}); err != nil {
			return err
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			return err
		}
		if sa6, ok := sa.(*unix.SockaddrInet6); ok {
			peer = netip.AddrPortFrom(netip.AddrFrom16(sa6.Addr), uint16(sa6.Port))
		}
		b := make([]byte, 512)
		n, err := unix.Read(fd, b)
		if err != nil {
			return err
		}
		reply = string(b[:n])
		return nil
	})
	if err != nil {
		t.Fatalf("AF_INET6 socket to %s: %v", mapped, err)
	}
	if peer != mapped {
		t.Errorf("getpeername says %s, want %s", peer, mapped)
	}
	if r, err := testnet.ParseReply(reply); err != nil || r.Server != x.p11.Name {
		t.Errorf("answer %q (%v), want one from %s", reply, err, x.p11.Name)
	}
}

// TestNoEndpoints: a service without endpoints refuses connect and
// sendto at once; one whose Local policy leaves no endpoint here fails
// with EPERM (a drop).
func TestNoEndpoints(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newFixture(t, f, nil)
		v, w := vip(f, 20), vip(f, 21)
		local := svc("local", model.TCP, w, 80)
		local.Targets.HasEndpoints = true // endpoints exist, none here
		x.sync([]testSvc{svc("empty", model.TCP, v, 80), svc("empty-udp", model.UDP, v, 53), local})
		for _, from := range []*testnet.Host{x.node, x.pod3} {
			for _, c := range []struct {
				proto string
				d     netip.AddrPort
				want  testnet.Outcome
			}{{"tcp", ap(v, 80), testnet.Refused}, {"udp", ap(v, 53), testnet.Refused}, {"tcp", ap(w, 80), testnet.Dropped}} {
				var r testnet.Result
				if c.proto == "udp" {
					r = from.UDP(c.d, 2*time.Second)
				} else {
					r = from.TCP(c.d, 2*time.Second)
				}
				if r.Outcome != c.want || r.Elapsed > 100*time.Millisecond {
					t.Errorf("%s -> %s/%s: %v; want %v at once", from.Name, c.d, c.proto, r, c.want)
				}
			}
		}
		_, _, err := unconnectedUDP(x.pod3, ap(v, 53))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("sendto %s without endpoints: %v, want ECONNREFUSED", ap(v, 53), err)
		}
	})
}

// TestUDPConnectPassthrough: with the nftables rules composed, connect
// of a UDP socket to a service without endpoints succeeds untranslated
// (the rules reject its datagrams), so a client socket created before
// the endpoints follows the service once they exist.
func TestUDPConnectPassthrough(t *testing.T) {
	x := newFixture(t, model.IPv4, func(c *Config) { c.SocketOnly = false })
	v := vip(model.IPv4, 22)
	x.sync([]testSvc{svc("dns", model.UDP, v, 53)})
	r := x.pod3.UDP(ap(v, 53), 2*time.Second)
	if r.Outcome != testnet.Refused {
		t.Errorf("UDP to %s without endpoints: %v; want refused by the nftables rules", ap(v, 53), r)
	}
	s, err := x.pod3.UDPSocket(ap(v, 53))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer s.Close()
	x.sync([]testSvc{svc("dns", model.UDP, v, 53, x.ep(x.p11, 8081))}, backendtest.PortName("dns", "", model.UDP))
	if r := s.Query(2 * time.Second); r.Outcome != testnet.Answered || r.Server != x.p11.Name {
		t.Errorf("socket connected before the endpoint existed: %v; want an answer from %s", r, x.p11.Name)
	}
}

// TestNodePortFromLocalSockets: a node port on any node address is
// translated for the node and its pods; other ports of the node address
// are not.
func TestNodePortFromLocalSockets(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newFixture(t, f, nil)
		s := svc("np", model.TCP, vip(f, 30), 80, x.ep(x.p11, 8080), x.ep(x.p21, 8080))
		s.Port.NodePort = 30080
		x.sync([]testSvc{s})
		for _, from := range []*testnet.Host{x.node, x.pod3} {
			for _, a := range []netip.Addr{x.tn.Node1.IP(f), x.tn.Node1.ExternalIP(f)} {
				x.reaches(from, "tcp", ap(a, 30080), 8080, 20, x.p11, x.p21)
			}
		}
		if r := x.pod3.TCP(ap(x.tn.Node1.IP(f), 30081), time.Second); r.Outcome == testnet.Answered {
			t.Errorf("a port that is no node port answered: %v", r)
		}
	})
}

// TestSessionAffinity: every connection of a client namespace reaches
// one endpoint while it keeps connecting; after the timeout it may move;
// after affinity is turned off connections spread again.
func TestSessionAffinity(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	v := vip(model.IPv4, 40)
	s := svc("sticky", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080))
	s.Port.SessionAffinity, s.Port.AffinityTimeout = true, time.Second
	x.sync([]testSvc{s})
	first := map[string]string{}
	for _, from := range []*testnet.Host{x.node, x.pod3} {
		got := x.answers(from, "tcp", ap(v, 80), 8080, 20, x.p11, x.p12, x.p21)
		if len(got) != 1 {
			t.Errorf("%s with session affinity reached several endpoints: %v", from.Name, got)
		}
		for k := range got {
			first[from.Name] = k
		}
	}
	// After the timeout, the node may land elsewhere.
	moved := false
	for round := 0; round < 10 && !moved; round++ {
		time.Sleep(1100 * time.Millisecond)
		for k := range x.answers(x.node, "tcp", ap(v, 80), 8080, 3, x.p11, x.p12, x.p21) {
			moved = moved || k != first[x.node.Name]
		}
	}
	if !moved {
		t.Errorf("node stayed on %s across 10 pauses longer than the 1s affinity timeout", first[x.node.Name])
	}
	s.Port = &model.ServicePort{Name: s.Port.Name, ClusterIP: v, Port: 80, Protocol: model.TCP}
	x.sync([]testSvc{s}, s.Port.Name)
	x.reaches(x.pod3, "tcp", ap(v, 80), 8080, 30, x.p11, x.p12, x.p21)
}

// TestAffinitySurvivesCompaction: removing an endpoint moves the last one
// into its slot; a client pinned to the moved endpoint stays with it.
func TestAffinitySurvivesCompaction(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	v := vip(model.IPv4, 41)
	all := []netip.AddrPort{x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080)}
	s := svc("sticky", model.TCP, v, 80, all...)
	s.Port.SessionAffinity, s.Port.AffinityTimeout = true, time.Hour
	x.sync([]testSvc{s})
	// Find a client pinned to the endpoint of the last slot.
	g := x.b.st.svcs[s.Port.Name].groups[0]
	last := g.eps[len(g.eps)-1]
	var pinnedHost *testnet.Host
	for _, h := range []*testnet.Host{x.node, x.pod3} {
		r := h.TCP(ap(v, 80), 2*time.Second)
		if r.Outcome == testnet.Answered && r.Server == podOf(x, last).Name {
			pinnedHost = h
		}
	}
	if pinnedHost == nil {
		t.Skip("no client landed on the last slot's endpoint (random); nothing to check")
	}
	// Remove the first slot's endpoint: the last moves into slot 0.
	s2 := svc("sticky", model.TCP, v, 80, slices.DeleteFunc(slices.Clone(all), func(a netip.AddrPort) bool { return a == g.eps[0] })...)
	s2.Port = s.Port
	x.sync([]testSvc{s2}, s.Port.Name)
	if ng := x.b.st.svcs[s.Port.Name].groups[0]; ng.eps[0] != last {
		t.Fatalf("slot 0 holds %s, want the moved %s", ng.eps[0], last)
	}
	got := x.answers(pinnedHost, "tcp", ap(v, 80), 8080, 10, x.p11, x.p12, x.p21)
	if len(got) != 1 || got[podOf(x, last).Name] != 10 {
		t.Errorf("%s pinned to %s reached %v after its slot moved", pinnedHost.Name, last, got)
	}
}

func podOf(x *fixture, a netip.AddrPort) *testnet.Pod {
	for _, p := range x.tn.Pods {
		if p.IP(x.f) == a.Addr() {
			return p
		}
	}
	return nil
}

// TestEndpointRemoval: new connections no longer reach a removed
// endpoint, and the slots stay compact.
func TestEndpointRemoval(t *testing.T) {
	x := newFixture(t, model.IPv6, nil)
	v := vip(model.IPv6, 50)
	s := svc("shrink", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080))
	x.sync([]testSvc{s})
	x.reaches(x.pod3, "tcp", ap(v, 80), 8080, 30, x.p11, x.p12, x.p21)
	s = svc("shrink", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p21, 8080))
	x.sync([]testSvc{s}, s.Port.Name)
	x.reaches(x.pod3, "tcp", ap(v, 80), 8080, 30, x.p11, x.p21)
	have, err := x.b.codec.readBe(x.b.beMap)
	if err != nil {
		t.Fatal(err)
	}
	id := x.b.st.svcs[s.Port.Name].groups[0].id
	var slots []uint32
	for k := range have {
		if k.ID == id {
			slots = append(slots, k.Slot)
		}
	}
	slices.Sort(slots)
	if !slices.Equal(slots, []uint32{0, 1}) {
		t.Errorf("slots of the group after a removal: %v, want [0 1]", slots)
	}
	// The service goes away: its frontend and slots too.
	x.sync(nil, s.Port.Name)
	if r := x.pod3.TCP(ap(v, 80), time.Second); r.Outcome == testnet.Answered {
		t.Errorf("deleted service answered: %v", r)
	}
	for _, m := range []int{mapLen(t, x.b.codec, x.b, true), mapLen(t, x.b.codec, x.b, false)} {
		if m != 0 {
			t.Errorf("maps hold %d entries after the service was deleted", m)
		}
	}
}

func mapLen(t *testing.T, c codec, b *backend, svcs bool) int {
	t.Helper()
	if svcs {
		m, err := c.readSvc(b.svcMap)
		if err != nil {
			t.Fatal(err)
		}
		return len(m)
	}
	m, err := c.readBe(b.beMap)
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// TestUDPSocketDestroyed: a connected UDP socket translated to an
// endpoint that leaves the service is destroyed (the application sees
// an error and reconnects); a new socket reaches the new endpoint; a
// socket translated to an endpoint that stays is untouched.
func TestUDPSocketDestroyed(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newFixture(t, f, nil)
		if x.b.dp.destroy == nil {
			t.Fatal("kernel 6.18 should destroy sockets (bpf_sock_destroy), but the iterator did not load")
		}
		v := vip(f, 60)
		a := svc("dns", model.UDP, v, 53, x.ep(x.p11, 8081))
		keep := svc("keep", model.UDP, vip(f, 61), 53, x.ep(x.p11, 8081))
		x.sync([]testSvc{a, keep})
		var socks []*testnet.UDPSocket
		for _, d := range []netip.AddrPort{ap(v, 53), ap(vip(f, 61), 53)} {
			s, err := x.pod3.UDPSocket(d)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if r := s.Query(2 * time.Second); r.Outcome != testnet.Answered || r.Server != x.p11.Name {
				t.Fatalf("%s: %v", d, r)
			}
			socks = append(socks, s)
		}
		a = svc("dns", model.UDP, v, 53, x.ep(x.p21, 8081))
		x.sync([]testSvc{a, keep}, a.Port.Name)
		if r := socks[0].Query(time.Second); r.Outcome == testnet.Answered || r.Err == nil {
			t.Errorf("socket of the removed endpoint: %v; want it destroyed (an error)", r)
		} else {
			t.Logf("socket of the removed endpoint: %v", r)
		}
		if r := socks[1].Query(2 * time.Second); r.Outcome != testnet.Answered || r.Server != x.p11.Name {
			t.Errorf("socket of an endpoint that stays: %v; want an answer from %s", r, x.p11.Name)
		}
		x.answers(x.pod3, "udp", ap(v, 53), 8081, 5, x.p21)
	})
}

// TestRestartAdoptsPinnedState: with PinPath, a closed proxier leaves
// programs and maps in place; a new one adopts the pinned links (same
// link ids, new programs) and maps (affinity and reverse translations
// kept); established connections and getpeername keep working
// throughout; Cleanup removes every program and pin.
func TestRestartAdoptsPinnedState(t *testing.T) {
	pins := bpffs(t)
	x := newFixture(t, model.IPv4, func(c *Config) { c.PinPath = pins })
	v := vip(model.IPv4, 70)
	echo := svc("echo", model.TCP, v, 90, x.ep(x.p11, testnet.EchoPort))
	web := svc("web", model.TCP, v, 80, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080))
	web.Port.SessionAffinity, web.Port.AffinityTimeout = true, time.Hour
	svcs := []testSvc{echo, web}
	x.sync(svcs)
	c, err := x.pod3.DialTCP(ap(v, 90), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sticky := x.answers(x.pod3, "tcp", ap(v, 80), 8080, 5, x.p11, x.p12, x.p21)
	progs := attachedPrograms(t, x.cg)
	if err := x.b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := attachedPrograms(t, x.cg); !slices.Equal(got, progs) {
		t.Fatalf("programs after Close: %v, want %v (left in place)", got, progs)
	}
	if err := testnet.Echo(c, "closed", 2*time.Second); err != nil {
		t.Errorf("established connection with the proxier closed: %v", err)
	}
	x.answers(x.pod3, "tcp", ap(v, 80), 8080, 3, x.p11, x.p12, x.p21)

	x.b = x.newBackend()
	if got := attachedPrograms(t, x.cg); !slices.Equal(got, progs) {
		t.Fatalf("a new proxier changed the programs before its first sync: %v, want %v", got, progs)
	}
	x.sync(svcs)
	after := attachedPrograms(t, x.cg)
	if len(after) != len(progs) || slices.Equal(after, progs) {
		t.Errorf("programs after the restart: %v; want %d new ones in the pinned links (before: %v)", after, len(progs), progs)
	}
	if err := testnet.Echo(c, "restarted", 2*time.Second); err != nil {
		t.Errorf("established connection after the restart: %v", err)
	}
	if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != ap(v, 90) {
		t.Errorf("getpeername of an established connection says %s, want %s", got, ap(v, 90))
	}
	again := x.answers(x.pod3, "tcp", ap(v, 80), 8080, 5, x.p11, x.p12, x.p21)
	if len(again) != 1 || len(sticky) != 1 || !sameKeys(sticky, again) {
		t.Errorf("affinity across the restart: before %v, after %v", sticky, again)
	}
	if err := x.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := attachedPrograms(t, x.cg); len(got) != 0 {
		t.Errorf("programs attached after Cleanup: %v", got)
	}
	if got := pinned(t, pins); len(got) != 0 {
		t.Errorf("pins left after Cleanup: %v", got)
	}
}

// sameKeys reports whether a and b have the same keys.
func sameKeys(a, b map[string]int) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return len(a) == len(b)
}

// TestCleanupByNewInstance: a new proxier that never synced removes a
// predecessor's pinned programs and maps.
func TestCleanupByNewInstance(t *testing.T) {
	pins := bpffs(t)
	x := newFixture(t, model.IPv6, func(c *Config) { c.PinPath = pins })
	x.sync([]testSvc{svc("web", model.TCP, vip(model.IPv6, 80), 80, x.ep(x.p11, 8080))})
	x.b.Close()
	if len(attachedPrograms(t, x.cg)) == 0 || len(pinned(t, pins)) == 0 {
		t.Fatal("nothing attached or pinned after Close")
	}
	b := x.newBackend()
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := attachedPrograms(t, x.cg); len(got) != 0 {
		t.Errorf("programs attached after Cleanup: %v", got)
	}
	if got := pinned(t, pins); len(got) != 0 {
		t.Errorf("pins left after Cleanup: %v", got)
	}
}

// TestCleanupUnpinned: without PinPath, Cleanup (and Close) detach the
// programs.
func TestCleanupUnpinned(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	x.sync([]testSvc{svc("web", model.TCP, vip(model.IPv4, 90), 80, x.ep(x.p11, 8080))})
	if len(attachedPrograms(t, x.cg)) != len(hooks()) {
		t.Fatal("programs not attached")
	}
	if err := x.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := attachedPrograms(t, x.cg); len(got) != 0 {
		t.Errorf("programs attached after Cleanup: %v", got)
	}
	x.sync([]testSvc{svc("web", model.TCP, vip(model.IPv4, 90), 80, x.ep(x.p11, 8080))})
	x.answers(x.pod3, "tcp", ap(vip(model.IPv4, 90), 80), 8080, 3, x.p11)
	x.b.Close()
	if got := attachedPrograms(t, x.cg); len(got) != 0 {
		t.Errorf("programs attached after Close without PinPath: %v", got)
	}
}

// TestHostNamespaceUntouched: only the configured namespaces are
// translated. The allowlist holds node1 and its pods, not the test's own
// namespace; a service on a loopback address and port translates in
// node1 while the same connection in the test's namespace reaches a local
// listener untouched.
func TestHostNamespaceUntouched(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	host, err := netns.Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostCookie, err := netnsCookie(host)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host 127.0.0.1\n"))
			c.Close()
		}
	}()
	lo := l.Addr().(*net.TCPAddr).AddrPort()
	x.sync([]testSvc{svc("lo", model.TCP, lo.Addr(), lo.Port(), x.ep(x.p11, 8080))})
	allowed := map[uint64]bool{}
	if err := readAll(x.b.dp.objs.PkNetns, func(k uint64, _ uint8) { allowed[k] = true }); err != nil {
		t.Fatal(err)
	}
	if allowed[hostCookie] || len(allowed) != 1+len(x.tn.Node1.Pods) {
		t.Errorf("translated namespaces %v: want node1 and its %d pods, not the host (%d)", allowed, len(x.tn.Node1.Pods), hostCookie)
	}
	c, err := net.DialTimeout("tcp4", lo.String(), time.Second)
	if err != nil {
		t.Fatalf("host namespace: %v", err)
	}
	b := make([]byte, 64)
	n, _ := c.Read(b)
	c.Close()
	if !strings.HasPrefix(string(b[:n]), "host") {
		t.Errorf("host namespace -> %s reached %q, want the local listener", lo, b[:n])
	}
	x.answers(x.node, "tcp", lo, 8080, 3, x.p11)
}

// TestMapFull: a service port that does not fit is reported, naming the
// map; the others are programmed.
func TestMapFull(t *testing.T) {
	x := newFixture(t, model.IPv4, func(c *Config) { c.MaxBackends = 3 })
	v := vip(model.IPv4, 100)
	small := svc("a-small", model.TCP, v, 80, x.ep(x.p11, 8080))
	big := svc("b-big", model.TCP, v, 81, x.ep(x.p11, 8080), x.ep(x.p12, 8080), x.ep(x.p21, 8080))
	err := x.b.Sync(t.Context(), request(model.IPv4, []testSvc{small, big}, nil))
	var oe *proxier.ObjectError
	var full *MapFullError
	if !errors.As(err, &oe) || oe.Service != big.Port.Name || !errors.As(err, &full) || full.Map != mapBe4 || !errors.Is(err, proxier.ErrCapacity) {
		t.Fatalf("sync: %v; want an ObjectError for %s naming %s, matching ErrCapacity", err, big.Port.Name, mapBe4)
	}
	t.Log(err)
	x.answers(x.pod3, "tcp", ap(v, 80), 8080, 3, x.p11)

	// The same through the engine: the service port that does not fit is
	// counted in proxykit_service_port_over_capacity; the small one is
	// still served.
	reg := prometheus.NewRegistry()
	cfg := x.cfg.Config
	cfg.Registerer, cfg.NoConntrackCleanup, cfg.NoServiceHealthChecks = reg, true, true
	e, err := proxier.New(cfg, x.b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	defer func() { cancel(); <-done }() // x closes the backend
	for i, s := range []scale.Service{
		{Name: "a-small", ClusterIP: v, Endpoints: []netip.Addr{x.p11.IP(x.f)}, EndpointNode: testnet.Node1Name},
		{Name: "b-big", ClusterIP: vip(model.IPv4, 101), Endpoints: []netip.Addr{x.p11.IP(x.f), x.p12.IP(x.f), x.p21.IP(x.f)}, EndpointNode: testnet.Node1Name},
	} {
		e.OnServiceAdd(s.Object(i))
		e.OnEndpointSliceAdd(s.Slice(0))
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := backendtest.Metrics(t, reg, "ip_family")["proxykit_service_port_over_capacity/IPv4"]; got != 1 {
		t.Errorf("proxykit_service_port_over_capacity %v, want 1 (b-big)", got)
	}
	x.answers(x.pod3, "tcp", ap(v, scale.Port), scale.TargetPort, 3, x.p11)
}
