package conntrack

import (
	"net/netip"

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
