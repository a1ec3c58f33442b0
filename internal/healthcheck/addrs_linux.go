//go:build linux

package healthcheck

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
)

// AddrsIn returns the addresses of the namespace ns that lie in one of
// prefixes (a proxier's NodePortAddresses), sorted: the addresses health
// check node ports listen on, as node ports open only there. IPv6
// link-local addresses are left out.
func AddrsIn(ns *netns.NS, prefixes []netip.Prefix) ([]netip.Addr, error) {
	h, err := ns.NetlinkHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("healthcheck: %w", err)
	}
	defer h.Close()
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("healthcheck: list addresses: %w", err)
	}
	ips := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			ips = append(ips, ip)
		}
	}
	return filterAddrs(ips, prefixes), nil
}
