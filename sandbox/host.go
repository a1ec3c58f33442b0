package sandbox

import (
	"context"
	"net/netip"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Host is one network namespace of a sandbox with its primary addresses:
// a node, a pod or the client. Its methods are safe for concurrent use.
type Host struct {
	// Name is the host's name: "node1", "node2", "client", or a pod's
	// name such as "node1-pod2". The namespace's own name is
	// [Host.NetNSName].
	Name string
	// IPv4 and IPv6 are the host's primary addresses: a pod's own
	// address, a node's internal address (on the node1-node2 link), the
	// client's address.
	IPv4, IPv6 netip.Addr

	ns *testnet.NS
}

// IP returns the host's primary address of family f.
func (h *Host) IP(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return h.IPv6
	}
	return h.IPv4
}

// NetNSName returns the name of the host's network namespace, e.g.
// pk-1a2b3c4d-node1, as `ip netns exec` takes it.
func (h *Host) NetNSName() string { return h.ns.Name() }

// NetNSPath returns the path of the host's network namespace, e.g.
// /var/run/netns/pk-1a2b3c4d-node1: the value proxier.Config.NetNS
// takes.
func (h *Host) NetNSPath() string { return h.ns.Path() }

// Do runs fn on an OS thread locked inside the host's network namespace,
// and returns fn's error. The caller's own threads never move. Sockets fn
// opens live in the namespace and may be used from any goroutine
// afterwards; fn must not start goroutines that expect to run in the
// namespace.
func (h *Host) Do(fn func() error) error { return h.ns.Do(fn) }

// Exec runs a program inside the host's network namespace and returns its
// standard output. A failure's error carries the program's standard
// error.
func (h *Host) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return h.ns.Exec(ctx, name, args...)
}

// Node is a node of a sandbox: it routes to its pods.
type Node struct {
	Host
	// ExternalIPv4 and ExternalIPv6 are node1's addresses toward the
	// client, where node ports answer; invalid for node2.
	ExternalIPv4, ExternalIPv6 netip.Addr
	// PodCIDRv4 and PodCIDRv6 are the node's pod networks, e.g.
	// 10.244.1.0/24 and fd00:10:244:1::/64 for node1.
	PodCIDRv4, PodCIDRv6 netip.Prefix
	// Pods are the pods behind the node.
	Pods []*Pod

	uplinkIPv4, uplinkIPv6 netip.Addr
}

// ExternalIP returns the node's address toward the client, of family f;
// invalid for node2.
func (n *Node) ExternalIP(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return n.ExternalIPv6
	}
	return n.ExternalIPv4
}

// PodCIDR returns the node's pod network of family f.
func (n *Node) PodCIDR(f model.IPFamily) netip.Prefix {
	if f == model.IPv6 {
		return n.PodCIDRv6
	}
	return n.PodCIDRv4
}

// Gateway returns the address of family f the node holds on every pod
// link (10.244.n.1, fd00:10:244:n::1): the pods' next hop, and the source
// a pod sees when the node masquerades traffic to it from the node's pod
// network.
func (n *Node) Gateway(f model.IPFamily) netip.Addr {
	return n.PodCIDR(f).Addr().Next()
}

// Addrs returns every address of family f the node holds on its links to
// other hosts, the pod gateways aside: its internal address, and for
// node1 also its external address and the address toward its default
// route (the source of its own packets to service addresses that are not
// masqueraded otherwise).
func (n *Node) Addrs(f model.IPFamily) []netip.Addr {
	out := []netip.Addr{n.IP(f)}
	up := n.uplinkIPv4
	if f == model.IPv6 {
		up = n.uplinkIPv6
	}
	for _, a := range []netip.Addr{n.ExternalIP(f), up} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// Pod is a pod of a sandbox, running the servers (see [ServerPorts]).
type Pod struct {
	Host
	// Node is the node the pod runs behind.
	Node *Node
}
