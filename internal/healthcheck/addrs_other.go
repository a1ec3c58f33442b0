//go:build !linux

package healthcheck

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/proxykit/proxykit/internal/netns"
)

// AddrsIn returns the caller's own addresses that lie in one of prefixes,
// sorted (off Linux there are no other namespaces); IPv6 link-local
// addresses are left out.
func AddrsIn(ns *netns.NS, prefixes []netip.Prefix) ([]netip.Addr, error) {
	if !ns.Own() {
		return nil, fmt.Errorf("healthcheck: %w", netns.ErrNotLinux)
	}
	list, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("healthcheck: list addresses: %w", err)
	}
	var ips []netip.Addr
	for _, a := range list {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ips = append(ips, ip)
			}
		}
	}
	return filterAddrs(ips, prefixes), nil
}
