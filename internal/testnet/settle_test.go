package testnet_test

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestBuildSettled checks that a topology is complete when New returns.
// The kernel adds some of it later than the calls that cause it, from a
// workqueue: the link-local address of a link that came up, the local
// route of every IPv6 address and, on a forwarding link, the anycast
// route of every prefix. A snapshot of a namespace taken right after New
// (as the conformance suite's cleanup cases take one) must not lack what
// appears a moment later.
func TestBuildSettled(t *testing.T) {
	t.Parallel()
	tp := testnet.New(t, testnet.Options{})
	// Read at once, before anything else gives the kernel time.
	type state struct {
		links  []netlink.Link
		addrs  []netlink.Addr
		routes []netlink.Route
	}
	got := map[*testnet.NS]state{}
	for _, ns := range tp.Namespaces() {
		var s state
		err := ns.Do(func() error {
			var err error
			if s.links, err = netlink.LinkList(); err != nil {
				return err
			}
			if s.addrs, err = netlink.AddrList(nil, netlink.FAMILY_V6); err != nil {
				return err
			}
			s.routes, err = netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		got[ns] = s
	}
	for ns, s := range got {
		forwarding := ns == tp.Node1.NS || ns == tp.Node2.NS
		for _, l := range s.links {
			a := l.Attrs()
			if a.Flags&net.FlagLoopback != 0 || len(a.HardwareAddr) != 6 {
				continue
			}
			ll := eui64LinkLocal(a.HardwareAddr)
			if !hasAddr(s.addrs, a.Index, ll) {
				t.Errorf("%s: link %s has no link-local address %s when New returned", ns, a.Name, ll)
			}
		}
		for _, a := range s.addrs {
			if !hasRoute(s.routes, unix.RTN_LOCAL, a.LinkIndex, a.IP) {
				t.Errorf("%s: address %s (link %d) has no local route when New returned", ns, a.IP, a.LinkIndex)
			}
			if ones, _ := a.Mask.Size(); forwarding && ones < 127 && !hasRoute(s.routes, unix.RTN_ANYCAST, a.LinkIndex, a.IP.Mask(a.Mask)) {
				t.Errorf("%s: prefix %s (link %d) has no anycast route when New returned", ns, a.IPNet, a.LinkIndex)
			}
		}
	}
}

func eui64LinkLocal(mac net.HardwareAddr) net.IP {
	return net.IP{0xfe, 0x80, 0, 0, 0, 0, 0, 0, mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
}

func hasAddr(addrs []netlink.Addr, link int, ip net.IP) bool {
	for _, a := range addrs {
		if a.LinkIndex == link && a.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func hasRoute(routes []netlink.Route, typ, link int, ip net.IP) bool {
	for _, r := range routes {
		if r.Type == typ && r.LinkIndex == link && r.Dst != nil && r.Dst.IP.Equal(ip) {
			return true
		}
	}
	return false
}
