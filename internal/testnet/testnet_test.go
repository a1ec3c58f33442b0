package testnet_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

var families = []model.IPFamily{model.IPv4, model.IPv6}

const timeout = 2 * time.Second

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// expect checks that r was answered by server on port, seeing source src
// (any source when src is invalid).
func expect(t *testing.T, what string, r testnet.Result, proto, server string, port uint16, src netip.Addr) {
	t.Helper()
	if r.Outcome != testnet.Answered {
		t.Errorf("%s: %v, want an answer from %s", what, r, server)
		return
	}
	if r.Server != server || r.Proto != proto || r.Port != port || (src.IsValid() && r.Source.Addr() != src) {
		t.Errorf("%s: %v, want %s %s port %d seeing %v", what, r, server, proto, port, src)
	}
}

// TestConnectivity proves plain routing between every kind of host, the
// servers' answers and the seen source addresses, for both families.
func TestConnectivity(t *testing.T) {
	t.Parallel()
	tp := testnet.New(t, testnet.Options{})
	if len(tp.Node1.Pods) != 3 || len(tp.Node2.Pods) != 2 || len(tp.Pods) != 5 {
		t.Fatalf("pods: node1 %d, node2 %d, all %d", len(tp.Node1.Pods), len(tp.Node2.Pods), len(tp.Pods))
	}
	for _, f := range families {
		t.Run(f.String(), func(t *testing.T) {
			for _, p := range tp.Pods {
				for _, port := range testnet.ServerPorts {
					dst := ap(p.IP(f), port)
					expect(t, "client->"+p.Name, tp.Client.TCP(dst, timeout), "tcp", p.Name, port, tp.Client.IP(f))
					expect(t, "client->"+p.Name, tp.Client.UDP(dst, timeout), "udp", p.Name, port, tp.Client.IP(f))
				}
				dst := ap(p.IP(f), 8080)
				// The node reaches its own pods from the gateway address
				// and the other node's pods from its internal address.
				src := tp.Node1.Gateway(f)
				if p.Node != tp.Node1 {
					src = tp.Node1.IP(f)
				}
				expect(t, "node1->"+p.Name, tp.Node1.TCP(dst, timeout), "tcp", p.Name, 8080, src)
				expect(t, "node1->"+p.Name+" sctp", tp.Node1.SCTPInit(ap(p.IP(f), 7777), timeout), "sctp", p.Name, 7777, src)
				for _, q := range tp.Pods {
					if q == p {
						continue
					}
					expect(t, q.Name+"->"+p.Name, q.TCP(dst, timeout), "tcp", p.Name, 8080, q.IP(f))
					expect(t, q.Name+"->"+p.Name, q.UDP(dst, timeout), "udp", p.Name, 8080, q.IP(f))
				}
				expect(t, "client->"+p.Name+" sctp", tp.Client.SCTPInit(ap(p.IP(f), 9999), timeout), "sctp", p.Name, 9999, tp.Client.IP(f))
				c, err := tp.Client.DialTCP(ap(p.IP(f), testnet.EchoPort), timeout)
				if err != nil {
					t.Fatalf("echo dial %s: %v", p.Name, err)
				}
				for _, line := range []string{"hello", "again"} {
					if err := testnet.Echo(c, line, timeout); err != nil {
						t.Errorf("echo %s: %v", p.Name, err)
					}
				}
				c.Close()
			}
			// Nothing listens on other ports: a reset, at once.
			r := tp.Client.TCP(ap(tp.Pods[0].IP(f), 1), timeout)
			if r.Outcome != testnet.Refused || r.Elapsed > time.Second {
				t.Errorf("closed port: %v, want refused at once", r)
			}
			r = tp.Client.UDP(ap(tp.Pods[0].IP(f), 1), timeout)
			if r.Outcome != testnet.Refused {
				t.Errorf("closed UDP port: %v, want refused", r)
			}
			// The client is outside: no route to a pod network from node2
			// except via node1, and the client itself serves nothing.
			r = tp.Node2.TCP(ap(tp.Client.IP(f), 8080), timeout)
			if r.Outcome != testnet.Refused {
				t.Errorf("node2->client: %v, want refused (client reachable, no server)", r)
			}
		})
	}
}

// TestNamespaces checks the namespaces' names, sysctls and that the
// caller's own namespace is not changed.
func TestNamespaces(t *testing.T) {
	t.Parallel()
	before := hostState(t)
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	nss := tp.Namespaces()
	if len(nss) != 6 {
		t.Fatalf("%d namespaces, want 6", len(nss))
	}
	for _, ns := range nss {
		if !strings.HasPrefix(ns.Name(), "pk-"+tp.ID+"-") || ns.Path() != filepath.Join(testnet.NetNSDir, ns.Name()) {
			t.Errorf("namespace %s at %s", ns.Name(), ns.Path())
		}
		if _, err := os.Stat(ns.Path()); err != nil {
			t.Error(err)
		}
	}
	for _, x := range []struct {
		ns        *testnet.NS
		key, want string
	}{
		{tp.Node1.NS, "net/ipv4/ip_forward", "1"},
		{tp.Node1.NS, "net/ipv6/conf/all/forwarding", "1"},
		{tp.Node2.NS, "net/ipv4/ip_forward", "1"},
		{tp.Client.NS, "net/ipv4/ip_forward", "0"},
		{tp.Uplink.NS, "net/ipv4/ip_forward", "0"},
		{tp.Pods[0].NS, "net/ipv4/ip_forward", "0"},
		{tp.Pods[0].NS, "net/ipv6/conf/eth0/accept_dad", "0"},
		{tp.Node1.NS, "net/ipv4/conf/pod1/rp_filter", "0"},
	} {
		got, err := x.ns.Sysctl(x.key)
		if err != nil || got != x.want {
			t.Errorf("%s %s = %q, %v; want %q", x.ns, x.key, got, err, x.want)
		}
	}
	out, err := tp.Node1.Exec(context.Background(), "ip", "-br", "link")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"client@", "node2@", "uplink@", "pod1@", "lo "} {
		if !strings.Contains(out, l) {
			t.Errorf("node1 links lack %q:\n%s", l, out)
		}
	}
	if after := hostState(t); after != before {
		t.Errorf("host namespace changed:\n%s\n---\n%s", before, after)
	}
}

// hostState reads (never writes) a few facts of the caller's own
// namespace.
func hostState(t *testing.T) string {
	var b strings.Builder
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(k + "=" + strings.TrimSpace(string(v)) + "\n")
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	slices.Sort(names)
	b.WriteString(strings.Join(names, ","))
	return b.String()
}

// TestTeardown checks that Close removes every namespace, is idempotent,
// and reports a socket left in a namespace.
func TestTeardown(t *testing.T) {
	t.Parallel()
	ctb := newCaptureTB(t)
	tp := testnet.New(ctb, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	paths := []string{}
	for _, ns := range tp.Namespaces() {
		paths = append(paths, ns.Path())
	}
	// A socket the harness does not know about, left open in node1.
	var leaked net.Listener
	if err := tp.Node1.Do(func() error {
		var err error
		leaked, err = net.Listen("tcp4", "0.0.0.0:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// And one it handed out, which it closes itself.
	if _, err := tp.Client.UDPSocket(ap(tp.Pods[0].IPv4, 8080)); err != nil {
		t.Fatal(err)
	}
	err := tp.Close()
	if err == nil || !strings.Contains(err.Error(), "socket in namespace pk-"+tp.ID+"-node1") {
		t.Errorf("Close with a leaked socket: %v, want a leak report naming node1", err)
	} else if strings.Contains(err.Error(), "-client") {
		t.Errorf("Close reported the tracked client socket: %v", err)
	}
	leaked.Close()
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", p, err)
		}
	}
	if err2 := tp.Close(); err2 != err {
		t.Errorf("second Close: %v, want the first result", err2)
	}
	ctb.runCleanups()
	if len(ctb.errs) != 1 {
		t.Errorf("cleanup reported %q, want the leak once", ctb.errs)
	}
}

// TestTeardownClean checks that a topology that was used leaves nothing.
func TestTeardownClean(t *testing.T) {
	t.Parallel()
	ctb := newCaptureTB(t)
	tp := testnet.New(ctb, testnet.Options{Node1Pods: 2, Node2Pods: 1})
	r := tp.Pods[0].TCP(ap(tp.Pods[2].IPv6, 8081), timeout)
	expect(t, "pod->pod", r, "tcp", tp.Pods[2].Name, 8081, tp.Pods[0].IPv6)
	if _, err := tp.Pods[1].DialTCP(ap(tp.Pods[2].IPv4, testnet.EchoPort), timeout); err != nil {
		t.Fatal(err)
	}
	if err := tp.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	m, _ := filepath.Glob(filepath.Join(testnet.NetNSDir, "pk-"+tp.ID+"-*"))
	if len(m) > 0 {
		t.Errorf("left: %v", m)
	}
	ctb.runCleanups()
	if len(ctb.errs) != 0 {
		t.Errorf("cleanup errors: %q", ctb.errs)
	}
}

// captureTB records errors and cleanups instead of acting on them. Its
// cleanups also run at the end of the real test, should it stop early.
type captureTB struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func newCaptureTB(t *testing.T) *captureTB {
	c := &captureTB{TB: t}
	t.Cleanup(c.runCleanups)
	return c
}

func (c *captureTB) Errorf(format string, args ...any) {
	c.errs = append(c.errs, format)
}

func (c *captureTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

func (c *captureTB) runCleanups() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
	c.cleanups = nil
}
