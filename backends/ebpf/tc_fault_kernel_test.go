package ebpf

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// The tests in this file run the tc plane through faults of the node's
// network: interfaces that go away and come back.

// TestTCInterfaceReplaced: node1's external veth (toward the client) is
// deleted and created again under the same name, with the same
// addresses and a new index. Until the next sync the node port is not
// served there (the programs went with the old interface); after it,
// the new interface carries the program of its role, the old index has
// no attachment and no pk_ifaddr entry left, the new one has its
// address there, and the client reaches the node port again over TCP
// and UDP, with the sources a node port's flows get. Both attach paths
// run.
func TestTCInterfaceReplaced(t *testing.T) {
	forAttachModes(t, testTCInterfaceReplaced)
}

func testTCInterfaceReplaced(t *testing.T, f model.IPFamily, legacy bool) {
	testnet.RequireCommand(t, "ip")
	x := newTCFixture(t, f, legacy)
	both := x.localEps(8080, x.p11, x.p21)
	var svcs []testSvc
	for i, proto := range []model.Protocol{model.TCP, model.UDP} {
		s := svc("np-"+strings.ToLower(string(proto)), proto, vip(f, byte(10+i)), 80).WithTargets(both, both, true)
		s.Port.NodePort = 30080
		svcs = append(svcs, s)
	}
	x.sync(svcs)
	ext := ap(x.tn.Node1.ExternalIP(f), 30080)
	x.reachesWithSource("tcp", ext, 8080, 20, x.p11, x.p21)

	const dev = "client" // node1's side of the veth to the client
	old := x.ifindex(dev)
	x.replaceClientLink(dev)
	idx := x.ifindex(dev)
	if idx == old {
		t.Fatalf("%s has index %d again: the test needs a new one", dev, idx)
	}
	t.Logf("%s: index %d, was %d", dev, idx, old)
	// Before the sync nothing serves the node port on the new
	// interface: node1's own stack refuses it (which also says the new
	// link carries packets).
	x.refusedUntil(ext, 10*time.Second)

	x.sync(svcs)
	p := x.plane()
	p.mu.Lock()
	a, stale := p.atts[idx], p.atts[old]
	p.mu.Unlock()
	switch {
	case stale != nil:
		t.Errorf("attachment of the deleted index %d (%s) still held", old, stale.name)
	case a == nil:
		t.Errorf("no attachment of %s (index %d) after the sync", dev, idx)
	case !a.ext || a.name != dev:
		t.Errorf("attachment of index %d: %s external %v, want %s external", idx, a.name, a.ext, dev)
	}
	fam := uint32(unix.AF_INET)
	if f == model.IPv6 {
		fam = unix.AF_INET6
	}
	var k ifaddrKey
	var v [16]byte
	found := false
	it := p.objs.PkIfaddr.Iterate()
	for it.Next(&k, &v) {
		switch {
		case k.Ifindex == uint32(old):
			t.Errorf("%s still holds index %d (deleted): %v", mapIfAddr, old, netip.AddrFrom16(v).Unmap())
		case k.Ifindex == uint32(idx) && k.Family == fam:
			found = true
			if got, want := netip.AddrFrom16(v).Unmap(), x.tn.Node1.ExternalIP(f); got != want {
				t.Errorf("%s[%d] = %s, want %s", mapIfAddr, idx, got, want)
			}
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Errorf("%s holds no %v address of index %d", mapIfAddr, f, idx)
	}
	for _, proto := range []string{"tcp", "udp"} {
		x.reachesWithSource(proto, ext, 8080, 16, x.p11, x.p21)
	}
	x.noNetfilter()
}

// ifindex returns the index of node1's interface name.
func (x *tcFixture) ifindex(name string) int {
	x.t.Helper()
	var idx int
	err := x.node.Do(func() error {
		i, err := net.InterfaceByName(name)
		if err == nil {
			idx = i.Index
		}
		return err
	})
	if err != nil {
		x.t.Fatalf("interface %s of node1: %v", name, err)
	}
	return idx
}

// replaceClientLink deletes node1's veth dev to the client and creates
// it again as testnet wires it: the same names, addresses and routes on
// both sides, no DAD.
func (x *tcFixture) replaceClientLink(dev string) {
	x.t.Helper()
	ctx := context.Background()
	n1, cl := x.tn.Node1, x.client
	run := func(h *testnet.Host, args ...string) {
		x.t.Helper()
		if _, err := h.Exec(ctx, "ip", args...); err != nil {
			x.t.Fatal(err)
		}
	}
	run(x.node, "link", "del", dev)
	run(x.node, "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", cl.NS.Name())
	for _, c := range []struct {
		h         *testnet.Host
		link      string
		v4, v6    netip.Addr
		gw4, gw6  netip.Addr
		withRoute bool
	}{
		{x.node, dev, n1.ExternalIPv4, n1.ExternalIPv6, netip.Addr{}, netip.Addr{}, false},
		{cl, "eth0", cl.IPv4, cl.IPv6, n1.ExternalIPv4, n1.ExternalIPv6, true},
	} {
		run(c.h, "addr", "add", c.v4.String()+"/24", "dev", c.link)
		run(c.h, "addr", "add", c.v6.String()+"/64", "dev", c.link, "nodad")
		run(c.h, "link", "set", c.link, "up")
		if c.withRoute {
			run(c.h, "route", "add", "default", "via", c.gw4.String(), "dev", c.link)
			run(c.h, "-6", "route", "add", "default", "via", c.gw6.String(), "dev", c.link)
		}
	}
}

// refusedUntil waits, up to timeout, for TCP probes from the client to
// d to be refused (the new link's addresses become usable once the
// kernel sees its carrier), and fails if one is answered.
func (x *tcFixture) refusedUntil(d netip.AddrPort, timeout time.Duration) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []string
	for {
		r := x.client.TCP(d, time.Second)
		switch {
		case r.Outcome == testnet.Answered:
			x.t.Fatalf("client -> %s/tcp before the sync: %v, want no program to serve it", d, r)
		case r.Outcome == testnet.Refused:
			return
		}
		if s := r.Outcome.String(); !slices.Contains(seen, s) {
			seen = append(seen, s)
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("client -> %s/tcp: not refused within %v (outcomes %v): the new link does not carry packets", d, timeout, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
