package ebpf

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// nodeAddrs returns the node's addresses of the backend's family that
// node ports open on for local sockets: every address of the node's
// namespace but loopback and link-local ones, narrowed to
// NodePortAddresses when set. One netlink dump per sync.
func (b *backend) nodeAddrs() ([]netip.Addr, error) {
	fam := netlink.FAMILY_V4
	if b.family == model.IPv6 {
		fam = netlink.FAMILY_V6
	}
	list, err := b.nl.AddrList(nil, fam)
	if err != nil {
		return nil, fmt.Errorf("ebpf: list node addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if !b.family.Contains(ip) || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		if len(b.cfg.NodePortAddresses) > 0 && !slices.ContainsFunc(b.cfg.NodePortAddresses, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out, nil
}

// nodeRanges returns, with north-south at tc or XDP, the decision for
// the node's own sockets toward load-balancer IPs with source ranges
// (node-only frontends), else nil. As kube-proxy's firewall does for
// the node's packets, a socket is admitted when the source address the
// node's routes give toward the IP is in the ranges, or is one of the
// service's load-balancer IPs (a VIP that is a local address of the
// node) while the ranges hold the node's primary address. The routes
// are asked once per IP and sync (netlink, in the node's namespace): a
// route change is seen at the next sync of the service port, or the
// next full sync. An IP without a route (or whose lookup fails) is
// dropped: its connect would fail anyway.
func (b *backend) nodeRanges(req *proxier.SyncRequest) nodeRanges {
	if b.cfg.NorthSouth != NorthSouthTC && b.cfg.NorthSouth != NorthSouthXDP {
		return nil
	}
	nodeIP := proxier.PrimaryNodeIP(b.cfg.Config, req, b.family)
	srcs := map[netip.Addr]netip.Addr{}
	return func(sp *model.ServicePort, lb netip.Addr) bool {
		src, ok := srcs[lb]
		if !ok {
			src = b.routeSource(lb)
			srcs[lb] = src
		}
		if !src.IsValid() {
			return false
		}
		if sp.SourceRangesHold(src) {
			return true
		}
		return sp.SourceRangesHold(nodeIP) && slices.ContainsFunc(sp.LoadBalancerIPs, func(a netip.Addr) bool { return a.Unmap() == src })
	}
}

// routeSource returns the source address the node's namespace routes
// give toward dst, or the zero Addr when there is no route.
func (b *backend) routeSource(dst netip.Addr) netip.Addr {
	routes, err := b.nl.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		b.log.Debug("no route toward a load-balancer IP with source ranges: the node's sockets are dropped", "ip", dst, "err", err)
		return netip.Addr{}
	}
	src, ok := netip.AddrFromSlice(routes[0].Src)
	if !ok {
		return netip.Addr{}
	}
	return src.Unmap()
}
