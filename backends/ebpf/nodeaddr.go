package ebpf

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/model"
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
