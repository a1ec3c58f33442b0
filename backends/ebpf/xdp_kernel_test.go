package ebpf

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// netnsDoer runs a function in a network namespace (testnet.NS,
// netns.NS).
type netnsDoer interface {
	Do(func() error) error
}

// ethtoolSet sets one ethtool flag (cmd, e.g. ETHTOOL_STXCSUM) of dev
// in ns: the ioctl, as ethtool -K does.
func ethtoolSet(t testing.TB, ns netnsDoer, dev string, cmd uint32, on bool) {
	t.Helper()
	const siocEthtool = 0x8946
	val := struct{ cmd, data uint32 }{cmd: cmd}
	if on {
		val.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(&val))
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), siocEthtool, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ethtool %#x %s: %v", cmd, dev, err)
	}
}

// passXDP attaches an XDP program that passes every packet to dev in
// ns: a veth whose peer runs an XDP program takes XDP frames.
func passXDP(t testing.TB, ns netnsDoer, dev string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	err = ns.Do(func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
		if errors.Is(err, unix.EBUSY) {
			return nil // an earlier call's (a restarted proxier's factory)
		}
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("XDP pass program on %s: %v", dev, err)
	}
}

const (
	ethtoolSTXCSUM = 0x17 // ETHTOOL_STXCSUM
)

// newXDPFixture is newTCFixture with NorthSouth xdp. The hosts around
// node1 stand for the wire: their ends of node1's external veths take
// XDP frames (an XDP program of their own, the kernel's rule for a veth
// peer) and send complete checksums (no transmit offload), as a NIC
// receives them from the wire; so the XDP program may send out of
// node1's veths (NorthSouthXDPVeth).
func newXDPFixture(t *testing.T, f model.IPFamily, reg prometheus.Registerer) *tcFixture {
	t.Helper()
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "iptables-save")
	x := newFixture(t, f, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = NorthSouthXDP
		c.NorthSouthXDPVeth = true
		c.Registerer = reg
	})
	wireLikePeers(t, x.tn.Node1.Path())
	return &tcFixture{fixture: x, client: x.tn.Client}
}

// wireLikePeers makes the far ends of node1's external veths (node1's
// namespace at path, named like testnet's: pk-ID-node1) stand for the
// wire, as newXDPFixture says: the client's eth0, node2's node1 and the
// uplink's eth0 get an XDP program that passes everything and no
// transmit checksum offload.
func wireLikePeers(t testing.TB, node1 string) {
	t.Helper()
	prefix, ok := strings.CutSuffix(node1, "-"+testnet.Node1Name)
	if !ok {
		t.Fatalf("node1's namespace %s is not named like testnet's", node1)
	}
	for _, peer := range []struct{ host, dev string }{{"client", "eth0"}, {testnet.Node2Name, testnet.Node1Name}, {"uplink", "eth0"}} {
		ns, err := netns.Open(prefix + "-" + peer.host)
		if err != nil {
			t.Fatal(err)
		}
		passXDP(t, ns, peer.dev)
		ethtoolSet(t, ns, peer.dev, ethtoolSTXCSUM, false)
		ns.Close()
	}
}

// TestXDPNorthSouth: with NorthSouth xdp, a client outside the cluster
// reaches node ports, external and load-balancer IPs of node1 over TCP
// and UDP, IPv4 and IPv6, with the sources of TestTCNorthSouth; the
// flows to node2's endpoint are translated and redirected by the XDP
// program (its counters say so), those to node1's pod are passed to tc
// (a pod's veth takes no XDP frames from here), and a service without
// endpoints is rejected by tc behind it. node1 holds no netfilter rule.
func TestXDPNorthSouth(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		reg := prometheus.NewRegistry()
		x := newXDPFixture(t, f, reg)
		var svcs []testSvc
		for i, proto := range []model.Protocol{model.TCP, model.UDP} {
			p := strings.ToLower(string(proto))
			remote := x.localEps(8080, x.p21)
			s := svc("remote-"+p, proto, vip(f, byte(10+i)), 80).WithTargets(remote, remote, true)
			s.Port.NodePort = 30080
			s.Port.ExternalIPs = []netip.Addr{extIP(f, 10)}
			s.Port.LoadBalancerIPs = []netip.Addr{extIP(f, 20)}
			svcs = append(svcs, s)
			local := x.localEps(8080, x.p11)
			l := svc("local-"+p, proto, vip(f, byte(20+i)), 80).WithTargets(local, local, true)
			l.Port.NodePort = 30090
			svcs = append(svcs, l)
			none := svc("none-"+p, proto, vip(f, byte(40+i)), 80)
			none.Port.NodePort = 30092
			svcs = append(svcs, none)
		}
		x.sync(svcs)
		x.noNetfilter()
		ext, internal := x.tn.Node1.ExternalIP(f), x.tn.Node1.IP(f)
		_, redirect0, _, err := x.plane().xdpCounts()
		if err != nil {
			t.Fatal(err)
		}
		for _, proto := range []string{"tcp", "udp"} {
			for _, a := range []netip.Addr{ext, internal} {
				x.reachesWithSource(proto, ap(a, 30080), 8080, 8, x.p21)
			}
			x.reachesWithSource(proto, ap(extIP(f, 10), 80), 8080, 8, x.p21)
			x.reachesWithSource(proto, ap(extIP(f, 20), 80), 8080, 8, x.p21)
			x.reachesWithSource(proto, ap(ext, 30090), 8080, 8, x.p11)
			x.rejected(proto, ap(ext, 30092))
		}
		tx, redirect, pass, err := x.plane().xdpCounts()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("XDP: %d sent back out, %d redirected, %d passed to tc", tx, redirect, pass)
		// Every answered exchange to node2 is at least a request and a
		// reply, each redirected by XDP.
		if min := uint64(2 * 2 * 4 * 8); redirect-redirect0 < min {
			t.Errorf("XDP redirected %d packets, want at least %d: tc did the work", redirect-redirect0, min)
		}
		if pass == 0 {
			t.Error("XDP passed nothing to tc: the local pod and the reject must go there")
		}
		// proxykit_ebpf_xdp_packets_total reads the same counters.
		m := backendtest.Metrics(t, reg, "action")
		for action, n := range map[string]uint64{"tx": tx, "redirect": redirect, "pass": pass} {
			if got := m["proxykit_ebpf_xdp_packets_total/"+action]; got < float64(n) {
				t.Errorf("proxykit_ebpf_xdp_packets_total{action=%q} = %v, want at least %d (%v)", action, got, n, m)
			}
		}
		x.noNetfilter()
	})
}
