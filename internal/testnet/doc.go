// Package testnet builds throwaway network topologies for real-kernel tests:
// network namespaces joined by veth pairs, tiny servers in the pod
// namespaces, and clients that probe from any namespace and say where a
// packet landed and with what source address.
//
// # Topology
//
// [New] builds, for one test ([Build] for a program):
//
//	client  198.51.100.2 / 2001:db8:1::2       outside the cluster
//	   |  eth0 <-> client
//	node1   198.51.100.1 / 2001:db8:1::1       toward the client (external address)
//	        192.0.2.1    / 2001:db8:2::1       toward node2 (internal address)
//	        10.255.0.1   / 2001:db8:3::1       toward the uplink (default route)
//	   |  node2 <-> node1           |  uplink <-> eth0
//	node2   192.0.2.2 / 2001:db8:2::2    uplink  10.255.0.2 / 2001:db8:3::2
//
// The proxier under test programs node1. node2 holds remote endpoints and
// runs no proxier. The uplink stands for the rest of the world: node1's
// default route points there and it forwards and answers nothing, so a
// packet node1 does not handle is dropped silently.
//
// Pods are routed veths, not a bridge, so every packet between two pods of a
// node crosses the node's netfilter hooks (hairpin works without
// br_netfilter). Pod i (from 1) behind node n has eth0 10.244.n.(i+1)/32
// and fd00:10:244:n::(i+1)/128; the node side of the veth, named podI,
// holds 10.244.n.1/32, fd00:10:244:n::1/128 and fe80::1/64, and the pod
// routes by default via 10.244.n.1 and fe80::1. node1 routes the other
// node's pod network via node2 and everything else via the uplink (so
// cluster, external and load-balancer addresses always have a route);
// node2 and the client route everything via node1. Forwarding is on in
// the node namespaces; rp_filter and duplicate address detection are off
// everywhere.
//
// # Probes
//
// [NS.TCP], [NS.UDP] and [NS.SCTPInit] probe from any namespace with a
// timeout and return a [Result]: the [Reply] (which pod, which port, which
// source it saw) or how the probe failed: refused or unreachable (a
// reject), dropped by the probing namespace's own rules (EPERM) or timed
// out (a drop elsewhere). [NS.UDPSocket] keeps one source port across
// queries; [NS.DialTCP] and [Echo] hold a connection open.
//
// Every pod runs, for IPv4 and IPv6: a TCP and a UDP server on each of
// [ServerPorts] that answer with one line "<pod> <proto> <local port>
// <source ip:port> [<token>]" (TCP writes it on accept and closes, UDP
// answers every datagram, echoing the datagram as the token); a TCP echo
// server on [EchoPort]; and a raw IPPROTO_SCTP receiver that records every
// SCTP INIT chunk delivered to the pod. The kernel need not support SCTP
// sockets: [NS.SCTPInit] sends a hand-built INIT over a raw socket and the
// topology reports which pod received it, on which port and from which
// source. That checks delivery and NAT of SCTP packets, not an SCTP
// association.
//
// # Isolation and lifetime
//
// Namespaces are named pk-<8 hex digits>-<host>, bind-mounted under
// /var/run/netns, so parallel tests never collide and tools such as `ip
// netns exec` can reach them. Nothing is created in, or linked to, the
// caller's own network namespace; all addresses are from documentation and
// private ranges. Everything is torn down in t.Cleanup, also when the test
// fails, and the teardown fails the test if a file descriptor, socket or
// thread of the process still lives in one of the topology's namespaces
// (which would keep it alive).
//
// Programs that are not tests (the examples' sandboxes) call [Build]
// instead of [New] and tear the topology down themselves with
// [Topology.Close], or leave the namespaces behind for inspection with
// [Topology.Detach] and remove them later with [RemoveNamespaces].
//
// Tests that need root call [RequireRoot]; without privilege they skip,
// unless CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1 is set, in which case
// they fail. This package is test support: unlike library code it reads
// those environment variables (in RequireRoot and RequireCommand only).
package testnet
