//go:build linux

package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// Cleaner deletes stale flows through one netlink handle.
type Cleaner struct {
	h *netlink.Handle
}

// Open returns a Cleaner of the namespace ns, with a netlink handle of its
// own; Close releases it.
func Open(ns *netns.NS) (*Cleaner, error) {
	h, err := ns.NetlinkHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink handle: %w", err)
	}
	return &Cleaner{h: h}, nil
}

// Close releases the Cleaner's handle.
func (c *Cleaner) Close() { c.h.Close() }

// Clean deletes every UDP and SCTP flow of family whose original
// destination is a frontend in valid and whose reply source is not one of
// that frontend's valid endpoints, and every untranslated, unanswered TCP
// flow to a TCP frontend in valid (see [Valid]). It returns how many flows
// it deleted.
func (c *Cleaner) Clean(family model.IPFamily, valid Valid) (int, error) {
	if len(valid) == 0 {
		return 0, nil
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if family == model.IPv6 {
		fam = unix.AF_INET6
	}
	nodePorts := map[Frontend]bool{}
	for fe := range valid {
		if !fe.Addr.Addr().IsValid() {
			nodePorts[fe] = true
		}
	}
	n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, staleFilter{valid, nodePorts})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return int(n), fmt.Errorf("delete stale %s conntrack flows: %w", family, err)
	}
	return int(n), nil
}

type staleFilter struct {
	valid     Valid
	nodePorts map[Frontend]bool
}

func (s staleFilter) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	return Stale(f, s.valid, s.nodePorts)
}

// Stale reports whether flow f must be deleted under valid. nodePorts may
// be nil; it lists the node-port frontends of valid.
func Stale(f *netlink.ConntrackFlow, valid Valid, nodePorts map[Frontend]bool) bool {
	proto, ok := model.ProtocolOfNumber(f.Forward.Protocol)
	if !ok {
		return false
	}
	dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP)
	rsrc, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	dst, rsrc = dst.Unmap(), rsrc.Unmap()
	orig := netip.AddrPortFrom(dst, f.Forward.DstPort)
	reply := netip.AddrPortFrom(rsrc, f.Reverse.SrcPort)
	if proto == model.TCP {
		_, fresh := valid[Frontend{Addr: orig, Protocol: proto}]
		return fresh && UntranslatedSYN(f)
	}
	if eps, ok := valid[Frontend{Addr: orig, Protocol: proto}]; ok {
		_, keep := eps[reply]
		return !keep
	}
	np := Frontend{Addr: netip.AddrPortFrom(netip.Addr{}, f.Forward.DstPort), Protocol: proto}
	if nodePorts[np] && reply != orig {
		_, keep := valid[np][reply]
		return !keep
	}
	return false
}

// TCP states of nf_conntrack_tcp that mean "SYN sent, nothing answered".
const (
	tcpConntrackSynSent  = 1
	tcpConntrackSynSent2 = 9
)

// UntranslatedSYN reports whether f is a TCP flow in SYN_SENT whose reply
// is expected from its original destination itself: a SYN no NAT rule
// translated and nothing answered.
func UntranslatedSYN(f *netlink.ConntrackFlow) bool {
	info, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP)
	if f.Forward.Protocol != unix.IPPROTO_TCP || !ok || (info.State != tcpConntrackSynSent && info.State != tcpConntrackSynSent2) {
		return false
	}
	dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP)
	src, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP)
	return ok1 && ok2 && dst.Unmap() == src.Unmap() && f.Forward.DstPort == f.Reverse.SrcPort
}
