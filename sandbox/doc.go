// Package sandbox builds a throwaway network of Linux network namespaces
// to try a proxier in without a cluster: a node with pods behind it, a
// second node with more pods, and a client outside the cluster, all linked
// by veth pairs, with tiny servers in every pod and probes that say which
// pod answered and which source address it saw. The examples of this
// module (examples/demo, examples/cni-agent, examples/controller) run in
// one; so can a program or test of yours.
//
// # Layout
//
// [New] builds:
//
//	client  198.51.100.2 / 2001:db8:1::2       outside the cluster
//	   |
//	node1   198.51.100.1 / 2001:db8:1::1       toward the client (external address)
//	        192.0.2.1    / 2001:db8:2::1       toward node2 (internal address)
//	   |                                       pods node1-pod1.. 10.244.1.2.. / fd00:10:244:1::2..
//	node2   192.0.2.2 / 2001:db8:2::2          pods node2-pod1.. 10.244.2.2.. / fd00:10:244:2::2..
//
// A proxier runs in node1: give it [Host.NetNSPath] of [Sandbox.Node1] as
// proxier.Config.NetNS and [Sandbox.PodNetworks] as its ClusterCIDRs.
// node2 holds remote endpoints and runs no proxier. node1's default route
// leads to a host that answers nothing (not shown), so a packet node1 does
// not handle is dropped silently and a probe of it times out.
//
// Pods hang off their node by routed veths (no bridge), so every packet
// between two pods of a node crosses the node's netfilter hooks. Pod i of
// node n has 10.244.n.(i+1) and fd00:10:244:n::(i+1); its node holds
// [Node.Gateway], 10.244.n.1 and fd00:10:244:n::1, on every pod link.
// Forwarding is on in the nodes. Every address is from a private or
// documentation range and exists only inside the sandbox.
//
// # Servers and probes
//
// Every pod runs, for IPv4 and IPv6, a TCP and a UDP server on each of
// [ServerPorts] (8080, 8081, 8082). Each answers with one line naming the
// pod, the protocol, its port and the source address it saw; a probe
// parses it into a [Result]. A raw socket in every pod also records SCTP
// INIT chunks, so [Host.SCTPInit] checks delivery and NAT of SCTP without
// the kernel's SCTP module.
//
// [Host.TCP], [Host.UDP] and [Host.SCTPInit] probe from any host with a
// timeout and return a [Result]: who answered, or the [Outcome] that says
// how the probe failed (refused, unreachable, dropped, timed out).
//
// # eBPF
//
// The eBPF backend's socket programs attach to a cgroup v2 and translate
// the sockets of its processes. The sandbox's servers and probes are
// goroutines of the calling process, so a program moves itself into a
// cgroup of its own with [EnterCgroup], attaches there and leaves it when
// done; no other process of the machine is affected.
//
// # Lifetime
//
// Namespaces are named pk-<ID>-<host> (e.g. pk-1a2b3c4d-node1),
// bind-mounted under [NetNSDir], where `ip netns exec` finds them. Nothing
// is created in, or linked to, the caller's own network namespace.
// [Sandbox.Close] removes everything and reports anything of the process
// (a socket, a thread, an open namespace file) still left in a namespace;
// [Sandbox.Keep] stops the servers but leaves the namespaces, with what a
// proxier programmed in them, for inspection, and [Remove] removes them
// later by ID.
//
// Building a sandbox needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN in the
// initial user namespace); without it [New] fails with an error matching
// [ErrNotPrivileged]. Tests call [RequirePrivilege], which skips them
// without root. The package is Linux only.
package sandbox
