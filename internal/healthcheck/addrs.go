package healthcheck

import (
	"net/netip"
	"slices"
)

// filterAddrs returns the addresses of ips that lie in one of prefixes,
// unmapped, sorted, without repeats and without IPv6 link-local ones.
func filterAddrs(ips []netip.Addr, prefixes []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.IsLinkLocalUnicast() {
			continue
		}
		if slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
