package e2e

import (
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/conntrack"
	"github.com/proxykit/proxykit/internal/netns"
)

// untranslatedLeft returns how many of node1's conntrack entries are TCP
// SYNs to addr that were never translated nor answered, polling for up
// to wait until there are none. The tests' probes, sent while the address
// was not programmed yet, leave such entries; they come from a few
// namespaces and reuse source ports, and a SYN whose 5-tuple matches one
// is not NATed again, so it is rejected or lost for the entry's 120 s.
// The proxy must delete them once it has programmed the address (a real
// client retransmitting the SYN of a connection it opened just before the
// service existed is caught the same way).
func (e *env) untranslatedLeft(addr netip.Addr, wait time.Duration) int {
	e.t.Helper()
	ns, err := netns.Open(e.tp.Node1.Path())
	if err != nil {
		e.t.Fatal(err)
	}
	defer ns.Close()
	h, err := ns.NetlinkHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		e.t.Fatal(err)
	}
	defer h.Close()
	fam := netlink.InetFamily(unix.AF_INET)
	if addr.Is6() {
		fam = unix.AF_INET6
	}
	deadline := time.Now().Add(wait)
	for {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			e.t.Fatalf("conntrack in node1: %v", err)
		}
		n := 0
		for _, f := range flows {
			if dst, ok := netip.AddrFromSlice(f.Forward.DstIP); ok && dst.Unmap() == addr && conntrack.UntranslatedSYN(f) {
				n++
			}
		}
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}
