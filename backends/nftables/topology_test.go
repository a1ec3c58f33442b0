package nftables

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/netns"
)

// requireRoot skips a test that needs root, unless CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1 make the skip a failure.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("ip"); err == nil {
			return
		}
		failOrSkip(tb, "requires the ip command")
		return
	}
	failOrSkip(tb, "requires root")
}

func failOrSkip(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" || os.Getenv("PROXYKIT_REQUIRE_PRIVILEGED") == "1" {
		tb.Fatal(msg + " (CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1 forbid skipping)")
	}
	tb.Skip(msg)
}

// testNS is a network namespace created by a test.
type testNS struct {
	name string
	path string
	ns   *netns.NS
}

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newNS creates a namespace named pk-nft-<random>, deleted at cleanup.
func newNS(tb testing.TB) *testNS {
	tb.Helper()
	name := "pk-nft-" + randSuffix()
	mustRun(tb, "ip", "netns", "add", name)
	n := &testNS{name: name, path: "/var/run/netns/" + name}
	tb.Cleanup(func() {
		if n.ns != nil {
			n.ns.Close()
		}
		exec.Command("ip", "netns", "del", name).Run()
	})
	ns, err := netns.Open(n.path)
	if err != nil {
		tb.Fatal(err)
	}
	n.ns = ns
	n.ip(tb, "link", "set", "lo", "up")
	return n
}

func mustRun(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (n *testNS) ip(tb testing.TB, args ...string) {
	tb.Helper()
	mustRun(tb, append([]string{"ip", "-n", n.name}, args...)...)
}

func (n *testNS) exec(tb testing.TB, args ...string) string {
	tb.Helper()
	return mustRun(tb, append([]string{"ip", "netns", "exec", n.name}, args...)...)
}

// nft runs nft in the namespace and returns its output and error.
func (n *testNS) nft(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name, "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// link connects a and b with a veth pair and gives each side its
// addresses (prefixes).
func link(tb testing.TB, a *testNS, aIf string, aAddrs []string, b *testNS, bIf string, bAddrs []string) {
	tb.Helper()
	tmp := "pkv" + randSuffix()
	mustRun(tb, "ip", "-n", a.name, "link", "add", aIf, "type", "veth", "peer", "name", tmp, "netns", b.name)
	b.ip(tb, "link", "set", tmp, "name", bIf)
	for _, x := range []struct {
		n     *testNS
		ifc   string
		addrs []string
	}{{a, aIf, aAddrs}, {b, bIf, bAddrs}} {
		for _, ad := range x.addrs {
			args := []string{"addr", "add", ad, "dev", x.ifc}
			if strings.Contains(ad, ":") {
				args = append(args, "nodad")
			}
			x.n.ip(tb, args...)
		}
		x.n.ip(tb, "link", "set", x.ifc, "up")
	}
}

// topology is a node with two pods and an outside client:
//
//	pod1 10.0.1.2 fd00:1::2  --  node 10.0.1.1 fd00:1::1 (p1)
//	pod2 10.0.2.2 fd00:2::2  --  node 10.0.2.1 fd00:2::1 (p2)
//	client 192.0.2.2 2001:db8:1::2  --  node 192.0.2.1 2001:db8:1::1 (c0)
//
// The node routes service addresses (10.96.0.0/16, fd00:96::/64,
// 198.51.100.0/24, 203.0.113.0/24) to a device of their own, as a
// cluster's default route would.
type topology struct {
	node, pod1, pod2, client *testNS
}

func newTopology(tb testing.TB) *topology {
	tb.Helper()
	t := &topology{node: newNS(tb), pod1: newNS(tb), pod2: newNS(tb), client: newNS(tb)}
	t.node.exec(tb, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	link(tb, t.node, "p1", []string{"10.0.1.1/24", "fd00:1::1/64"}, t.pod1, "eth0", []string{"10.0.1.2/24", "fd00:1::2/64"})
	link(tb, t.node, "p2", []string{"10.0.2.1/24", "fd00:2::1/64"}, t.pod2, "eth0", []string{"10.0.2.2/24", "fd00:2::2/64"})
	link(tb, t.node, "c0", []string{"192.0.2.1/24", "2001:db8:1::1/64"}, t.client, "eth0", []string{"192.0.2.2/24", "2001:db8:1::2/64"})
	t.pod1.ip(tb, "route", "add", "default", "via", "10.0.1.1")
	t.pod1.ip(tb, "-6", "route", "add", "default", "via", "fd00:1::1")
	t.pod2.ip(tb, "route", "add", "default", "via", "10.0.2.1")
	t.pod2.ip(tb, "-6", "route", "add", "default", "via", "fd00:2::1")
	t.client.ip(tb, "route", "add", "default", "via", "192.0.2.1")
	t.client.ip(tb, "-6", "route", "add", "default", "via", "2001:db8:1::1")
	// A veth pair stands in for a dummy device (the module may be absent).
	t.node.ip(tb, "link", "add", "svc0", "type", "veth", "peer", "name", "svc1")
	t.node.ip(tb, "link", "set", "svc0", "up")
	t.node.ip(tb, "link", "set", "svc1", "up")
	for _, r := range []string{"10.96.0.0/16", "198.51.100.0/24", "203.0.113.0/24"} {
		t.node.ip(tb, "route", "add", r, "dev", "svc0")
	}
	t.node.ip(tb, "-6", "route", "add", "fd00:96::/64", "dev", "svc0")
	startServers(tb, t.pod1, "pod1")
	startServers(tb, t.pod2, "pod2")
	return t
}

// Pod servers listen on TCP 8080 and UDP 5353 (both families) and answer
// "NAME SOURCE-ADDRESS".
const podPort = 8080

func startServers(tb testing.TB, n *testNS, name string) {
	tb.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := n.ns.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", podPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ":5353")
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
				fmt.Fprintf(c, "%s %s\n", name, src)
				// Echo lines afterwards, for long-lived connections.
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s %s", name, line)
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			src := addr.(*net.UDPAddr).AddrPort().Addr().Unmap()
			pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, src)), addr)
		}
	}()
}

// answer is what a pod server said: its name and the source it saw.
type answer struct {
	pod string
	src netip.Addr
}

func parseAnswer(s string) (answer, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return answer{}, fmt.Errorf("bad answer %q", s)
	}
	a, err := netip.ParseAddr(f[1])
	return answer{f[0], a}, err
}

// askTCP connects from ns to addr and returns the server's answer.
func askTCP(n *testNS, addr netip.AddrPort, timeout time.Duration) (answer, error) {
	var a answer
	err := n.ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		a, err = parseAnswer(line)
		return err
	})
	return a, err
}

// askUDP sends a datagram from ns to addr and returns the answer.
func askUDP(n *testNS, addr netip.AddrPort, timeout time.Duration) (answer, error) {
	var a answer
	err := n.ns.Do(func() error {
		c, err := net.Dial("udp", addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return err
		}
		buf := make([]byte, 256)
		k, err := c.Read(buf)
		if err != nil {
			return err
		}
		a, err = parseAnswer(string(buf[:k]))
		return err
	})
	return a, err
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
