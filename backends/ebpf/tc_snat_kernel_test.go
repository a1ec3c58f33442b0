package ebpf

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCSNATPortsReused: with NorthSouthSNATPorts of two ports, a client
// outside the cluster opens many TCP connections, one after the other,
// to a node port whose only endpoint runs on node2 (SNATed to node1).
// Each closed connection (a FIN each way) gives its port to the next:
// every connection is answered, and the endpoint only ever sees the two
// configured source ports. Without the reuse, the third connection finds
// no free port and its SYNs are dropped.
func TestTCSNATPortsReused(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		testnet.RequireCommand(t, "nft")
		x := &tcFixture{fixture: newFixture(t, f, func(c *Config) {
			c.SocketOnly = false
			c.NorthSouth = NorthSouthTC
			c.NorthSouthSNATPorts = [2]uint16{61000, 61001}
		})}
		x.client = x.tn.Client
		remote := x.localEps(8080, x.p21)
		s := svc("np", model.TCP, vip(f, 10), 80).WithTargets(remote, remote, true)
		s.Port.NodePort = 30080
		x.sync([]testSvc{s})
		d := ap(x.tn.Node1.ExternalIP(f), 30080)
		for i := range 12 {
			r := x.client.TCP(d, 3*time.Second)
			if r.Outcome != testnet.Answered || r.Server != x.p21.Name {
				t.Fatalf("connection %d: client -> %s: %v, want an answer from %s", i, d, r, x.p21.Name)
			}
			if r.Source.Addr().Unmap() != x.tn.Node1.IP(f) || r.Source.Port() < 61000 || r.Source.Port() > 61001 {
				t.Errorf("connection %d: the endpoint saw source %s, want %s port 61000 or 61001", i, r.Source, x.tn.Node1.IP(f))
			}
		}
	})
}

// TestSNATPortsConfig: the default SNAT range is the widest run of
// ports from 1024 outside the node's ephemeral range; a
// NorthSouthSNATPorts that is not a range, or an ephemeral range that
// leaves too few ports, fails with the numbers in the message.
func TestSNATPortsConfig(t *testing.T) {
	for _, c := range []struct {
		in, local [2]uint16
		lo, hi    uint16
		ok        bool
	}{
		{[2]uint16{}, [2]uint16{32768, 60999}, 1024, 32767, true},
		{[2]uint16{}, [2]uint16{1024, 50000}, 50001, 65535, true},
		{[2]uint16{}, [2]uint16{10000, 65000}, 1024, 9999, true},
		{[2]uint16{}, [2]uint16{1024, 65000}, 0, 0, false},
		{[2]uint16{40000, 40000}, [2]uint16{32768, 60999}, 40000, 40000, true},
		{[2]uint16{0, 100}, [2]uint16{32768, 60999}, 0, 0, false},
		{[2]uint16{5000, 4000}, [2]uint16{32768, 60999}, 0, 0, false},
	} {
		cfg := Config{NorthSouthSNATPorts: c.in}
		lo, hi, err := cfg.snatPorts(c.local)
		if (err == nil) != c.ok || lo != c.lo || hi != c.hi {
			t.Errorf("snatPorts(%v) with ephemeral ports %v = %d, %d, %v", c.in, c.local, lo, hi, err)
		}
	}
}

// TestTCSNATKeepsClientPort: a SNATed flow keeps the client's source
// port when the SNAT range holds it, as conntrack does; a port outside
// the range maps to the same SNAT port each time, so the endpoint sees
// the same tuple again; another client port that maps to that SNAT port
// while the endpoint may still hold it (TIME_WAIT) gets another one.
// Without own_port (bpf/nodeport.h) ports are random: the endpoint sees
// the kept port one time in a hundred.
func TestTCSNATKeepsClientPort(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newSNATFixture(t, f, [2]uint16{20000, 20099})
		if got := x.connectFrom(t, 20050); got != 20050 {
			t.Errorf("client port 20050 (in the SNAT range): the endpoint saw port %d, want 20050", got)
		}
		first := x.connectFrom(t, 40000)
		if first < 20000 || first > 20099 {
			t.Fatalf("client port 40000: the endpoint saw port %d, want one of 20000-20099", first)
		}
		if again := x.connectFrom(t, 40000); again != first {
			t.Errorf("client port 40000 again: the endpoint saw port %d, want %d as the first time", again, first)
		}
		// 40100 maps to the same SNAT port as 40000 (the range holds
		// 100 ports); the endpoint closed that tuple first.
		if other := x.connectFrom(t, 40100); other == first {
			t.Errorf("client port 40100: the endpoint saw port %d, which client port 40000's closed flow still holds", other)
		}
	})
}

// TestTCSNATShortConnections: short connections one after the other,
// closed first by the endpoint (which then holds each tuple in
// TIME_WAIT), from the client's ephemeral ports through a node port to
// a remote endpoint, with the default SNAT range: the endpoint refuses
// none of their SYNs (PAWS), since each client tuple gets
// its own SNAT tuple. With random SNAT ports about one connection in a
// hundred collided with an older tuple of another client port and
// waited a second (measured: 455 refusals in 8,309 connections).
func TestTCSNATShortConnections(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newSNATFixture(t, f, [2]uint16{})
		before := x.pawsTimewait(t)
		for i := range 1500 {
			if p := x.connectFrom(t, 0); p == 0 {
				t.Fatalf("connection %d failed", i)
			}
		}
		if n := x.pawsTimewait(t) - before; n != 0 {
			t.Errorf("the endpoint refused %d SYNs on tuples it held in TIME_WAIT (TcpExtPAWSTimewait), want 0", n)
		}
	})
}

// snatFixture is a node port on node1 whose endpoint on node2 tells
// each connection the source port it sees and closes first.
type snatFixture struct {
	*tcFixture
	dst netip.AddrPort
}

func newSNATFixture(t *testing.T, f model.IPFamily, ports [2]uint16) *snatFixture {
	t.Helper()
	testnet.RequireCommand(t, "nft")
	x := &tcFixture{fixture: newFixture(t, f, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = NorthSouthTC
		c.NorthSouthSNATPorts = ports
	})}
	x.client = x.tn.Client
	const port = 9100
	remote := x.localEps(port, x.p21)
	s := svc("np", model.TCP, vip(f, 10), 80).WithTargets(remote, remote, true)
	s.Port.NodePort = 30080
	x.sync([]testSvc{s})
	var ln net.Listener
	if err := x.p21.Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%d\n", c.RemoteAddr().(*net.TCPAddr).Port)
			c.Close()
		}
	}()
	return &snatFixture{tcFixture: x, dst: ap(x.tn.Node1.ExternalIP(f), 30080)}
}

// connectFrom connects from the client's port (0: an ephemeral one) to
// the node port and returns the source port the endpoint saw, 0 if the
// connection failed. It reads until the endpoint closes, so the client
// keeps no TIME_WAIT and can bind the port again.
func (x *snatFixture) connectFrom(t *testing.T, port int) int {
	t.Helper()
	var seen int
	err := x.client.Do(func() error {
		d := net.Dialer{
			Timeout:   3 * time.Second,
			LocalAddr: &net.TCPAddr{Port: port},
			Control: func(_, _ string, c syscall.RawConn) error {
				return c.Control(func(fd uintptr) {
					unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				})
			},
		}
		c, err := d.Dial("tcp", x.dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		seen, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	if err != nil {
		t.Errorf("client port %d -> %s: %v", port, x.dst, err)
	}
	return seen
}

// pawsTimewait reads the endpoint's SYNs refused by PAWS: on tuples it
// holds in TIME_WAIT (TcpExtPAWSTimewait in newer kernels; older ones
// count them in PAWSEstab, which is summed in too).
func (x *snatFixture) pawsTimewait(t *testing.T) int {
	t.Helper()
	var n int
	err := x.p21.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		var names []string
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || f[0] != "TcpExt:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			found := false
			for i, name := range names {
				if (name == "PAWSTimewait" || name == "PAWSEstab") && i < len(f) {
					v, err := strconv.Atoi(f[i])
					if err != nil {
						return err
					}
					n += v
					found = true
				}
			}
			if found {
				return nil
			}
		}
		return fmt.Errorf("no TcpExt PAWSTimewait or PAWSEstab in /proc/net/netstat")
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
