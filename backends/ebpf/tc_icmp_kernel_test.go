package ebpf

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// icmpFixture is a UDP node port of node1 (30081) whose endpoint is
// node2's first pod (port 9101), SNATed to node1.
type icmpFixture struct {
	*tcFixture
	dst netip.AddrPort
}

func newICMPFixture(t *testing.T, f model.IPFamily) *icmpFixture {
	t.Helper()
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "ip")
	x := &tcFixture{fixture: newFixture(t, f, func(c *Config) {
		c.SocketOnly = false
		c.NorthSouth = NorthSouthTC
	})}
	x.client = x.tn.Client
	remote := x.localEps(9101, x.p21)
	s := svc("np", model.UDP, vip(f, 11), 81).WithTargets(remote, remote, true)
	s.Port.NodePort = 30081
	x.sync([]testSvc{s})
	return &icmpFixture{tcFixture: x, dst: ap(x.tn.Node1.ExternalIP(f), 30081)}
}

// setMTU sets the MTU of interface dev of namespace ns.
func setMTU(t *testing.T, ns *testnet.NS, dev string, mtu string) {
	t.Helper()
	if out, err := ns.Exec(context.Background(), "ip", "link", "set", dev, "mtu", mtu); err != nil {
		t.Fatalf("%s: ip link set %s mtu %s: %v %s", ns, dev, mtu, err, out)
	}
}

// pathMTU sends a datagram of 1400 bytes that may not be fragmented
// from the client to the node port and returns the path MTU the
// client's socket then knows (after up to 2 s).
func (x *icmpFixture) pathMTU(t *testing.T) int {
	t.Helper()
	mtu := 0
	err := x.client.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(x.dst))
		if err != nil {
			return err
		}
		defer c.Close()
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		v6 := x.f == model.IPv6
		rc.Control(func(fd uintptr) {
			if v6 {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
			} else {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			}
		})
		if err != nil {
			return err
		}
		if _, err := c.Write(make([]byte, 1400)); err != nil {
			return err
		}
		for deadline := time.Now().Add(2 * time.Second); ; {
			rc.Control(func(fd uintptr) {
				if v6 {
					mtu, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
				} else {
					mtu, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
				}
			})
			if err != nil || mtu < 1400 || time.Now().After(deadline) {
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatalf("client -> %s: %v", x.dst, err)
	}
	return mtu
}

// TestTCFragNeededAtNode: node1's link toward the endpoint has an MTU of
// 1280; a datagram of 1400 bytes that may not be fragmented is answered
// by node1 with ICMP fragmentation needed (ICMPv6 packet too big) about
// the client's own packet, so the client learns the path's MTU, as the
// stack answers a packet it cannot forward. Before, the first datagram
// of the flow was dropped without a word (the route lookup for its SNAT
// address failed on the MTU), and a tracked flow's went to the stack
// translated, whose error went to node1's own (SNAT) address: the
// client kept sending 1400 bytes into a black hole.
func TestTCFragNeededAtNode(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newICMPFixture(t, f)
		setMTU(t, x.tn.Node1.NS, testnet.Node2Name, "1280")
		setMTU(t, x.tn.Node2.NS, testnet.Node1Name, "1280")
		if mtu := x.pathMTU(t); mtu != 1280 {
			t.Errorf("the client's path MTU to %s is %d after a datagram of 1400 bytes, want 1280 (node1's ICMP error)", x.dst, mtu)
		}
	})
}

// TestTCRelatedErrorToClient: node2's link to the endpoint has an MTU of
// 1280; node2 answers the SNATed datagram of 1400 bytes with an ICMP
// error to node1's address about the translated packet. node1 translates
// the error back (the quoted packet becomes the client's, the error goes
// from the frontend to the client), as conntrack translates a related
// packet, and the client learns the path's MTU. Without it the error
// ended in node1's stack.
func TestTCRelatedErrorToClient(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newICMPFixture(t, f)
		setMTU(t, x.tn.Node2.NS, "pod1", "1280")
		if mtu := x.pathMTU(t); mtu != 1280 {
			t.Errorf("the client's path MTU to %s is %d after a datagram of 1400 bytes, want 1280 (node2's ICMP error, translated)", x.dst, mtu)
		}
	})
}

// TestTCRelatedErrorToEndpoint: the client sends a datagram and closes
// its socket; the endpoint's answer reaches a closed port, and the
// client answers with ICMP port unreachable about the translated reply.
// node1 translates the error toward the endpoint (the quoted packet
// becomes the reply as the endpoint sent it), whose socket (IP_RECVERR)
// receives ECONNREFUSED. Without it the error ended in node1's stack.
func TestTCRelatedErrorToEndpoint(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newICMPFixture(t, f)
		var srv *net.UDPConn
		if err := x.p21.Do(func() (err error) {
			srv, err = net.ListenUDP("udp", &net.UDPAddr{Port: 9101})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		rc, err := srv.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		rc.Control(func(fd uintptr) {
			if f == model.IPv6 {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
			} else {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.client.Do(func() error {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(x.dst))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("hello"))
			c.Close()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 64)
		_, from, err := srv.ReadFromUDPAddrPort(b)
		if err != nil {
			t.Fatalf("the endpoint got no datagram: %v", err)
		}
		if _, err := srv.WriteToUDPAddrPort([]byte("answer"), from); err != nil {
			t.Fatal(err)
		}
		var errno uint32
		for deadline := time.Now().Add(2 * time.Second); errno == 0 && time.Now().Before(deadline); {
			rc.Read(func(fd uintptr) bool {
				oob := make([]byte, 512)
				_, oobn, _, _, rerr := unix.Recvmsg(int(fd), make([]byte, 64), oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
				if rerr != nil {
					return true
				}
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				for _, m := range msgs {
					if len(m.Data) >= 4 {
						errno = binary.NativeEndian.Uint32(m.Data)
					}
				}
				return true
			})
			if errno == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if syscall.Errno(errno) != unix.ECONNREFUSED {
			t.Errorf("the endpoint's socket (answering %s) got error %v from the client's port unreachable, want %v", from, syscall.Errno(errno), unix.ECONNREFUSED)
		}
	})
}
