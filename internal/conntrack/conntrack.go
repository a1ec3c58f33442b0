package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// Frontend is one address a service is reached on.
type Frontend struct {
	// Addr is the service address and port (cluster IP, external IP or
	// load-balancer IP). For a node port it is the invalid address with
	// the node port as port: any destination address matches, but only
	// flows that were DNATed are considered.
	Addr     netip.AddrPort
	Protocol model.Protocol
}

// Valid is the set of endpoints each frontend may still reply from.
//
// A connectionless (UDP, SCTP) frontend in Valid loses every flow whose
// reply does not come from one of its endpoints. A TCP frontend is one
// that has just been programmed: it loses only the flows that were never
// translated and never answered (SYN_SENT with the reply expected from the
// frontend itself). Such a flow comes from a SYN sent before the service's
// rules existed; while it lives, the client's retransmissions of that SYN
// bypass NAT and are rejected or lost, for up to the 120 s SYN_SENT
// timeout. Established TCP flows are never touched, and a TCP frontend's
// endpoint set is ignored.
type Valid map[Frontend]map[netip.AddrPort]struct{}

// Add records that fe may reply from ep.
func (v Valid) Add(fe Frontend, ep netip.AddrPort) {
	m := v[fe]
	if m == nil {
		m = map[netip.AddrPort]struct{}{}
		v[fe] = m
	}
	if ep.IsValid() {
		m[ep] = struct{}{}
	}
}

// Cleaner deletes stale flows through one netlink handle.
type Cleaner struct {
	h *netlink.Handle
}

// New returns a Cleaner using h, a handle opened with NETLINK_NETFILTER in
// the namespace to clean.
func New(h *netlink.Handle) *Cleaner { return &Cleaner{h: h} }

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
