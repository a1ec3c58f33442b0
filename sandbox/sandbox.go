package sandbox

import (
	"context"
	"net/netip"
	"strings"

	"github.com/proxykit/proxykit/internal/testnet"
)

// NetNSDir is where the sandbox bind-mounts its namespaces, as `ip netns`
// does: a namespace's path is NetNSDir/pk-<ID>-<host>.
const NetNSDir = testnet.NetNSDir

// ErrNotPrivileged is matched by the error of [New] when the process may
// not create and configure network namespaces.
var ErrNotPrivileged = testnet.ErrNotPrivileged

// Options shape a sandbox. The zero value builds the default one: three
// pods behind node1 and two behind node2.
type Options struct {
	// Node1Pods and Node2Pods are the numbers of pods behind node1 and
	// node2; zero means 3 and 2. At most 200 each.
	Node1Pods, Node2Pods int
}

// Sandbox is a network of namespaces built by [New]: see the package
// documentation for its layout. Its hosts are safe for concurrent use.
type Sandbox struct {
	// ID is the random part of every namespace name, 8 hex digits: node1's
	// namespace is pk-<ID>-node1. [Remove] takes it.
	ID string
	// Node1 is where a proxier runs; Node2 holds remote endpoints.
	Node1, Node2 *Node
	// Client is outside the cluster, linked to node1's external address.
	Client *Host
	// Pods are all pods, node1's first.
	Pods []*Pod

	topo *testnet.Topology
}

// New builds a sandbox and starts the servers in its pods. The caller
// must call [Sandbox.Close] (or [Sandbox.Keep]) when done, also after a
// failure elsewhere; New itself removes whatever it created when it fails.
// Without the privilege to create network namespaces it fails with an
// error matching [ErrNotPrivileged].
//
// Building is short (tens of milliseconds on an idle machine) and is not
// interrupted midway: New returns ctx's error if ctx is done before it
// starts.
func New(ctx context.Context, opts Options) (*Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	topo, err := testnet.Build(testnet.Options{Node1Pods: opts.Node1Pods, Node2Pods: opts.Node2Pods})
	if err != nil {
		return nil, err
	}
	sb := &Sandbox{ID: topo.ID, Client: newHost(topo.Client), topo: topo}
	sb.Node1 = newNode(topo.Node1)
	sb.Node2 = newNode(topo.Node2)
	for _, n := range []*Node{sb.Node1, sb.Node2} {
		sb.Pods = append(sb.Pods, n.Pods...)
	}
	return sb, nil
}

func newHost(h *testnet.Host) *Host {
	return &Host{Name: h.Name, IPv4: h.IPv4, IPv6: h.IPv6, ns: h.NS}
}

func newNode(n *testnet.Node) *Node {
	node := &Node{
		Host:         *newHost(&n.Host),
		ExternalIPv4: n.ExternalIPv4,
		ExternalIPv6: n.ExternalIPv6,
		PodCIDRv4:    n.PodCIDRv4,
		PodCIDRv6:    n.PodCIDRv6,
		uplinkIPv4:   n.UplinkIPv4,
		uplinkIPv6:   n.UplinkIPv6,
	}
	for _, p := range n.Pods {
		node.Pods = append(node.Pods, &Pod{Host: *newHost(&p.Host), Node: node})
	}
	return node
}

// PodNetworks returns the pod networks of the whole sandbox,
// 10.244.0.0/16 and fd00:10:244::/48: the ClusterCIDRs of a proxier
// running in it.
func (sb *Sandbox) PodNetworks() []netip.Prefix {
	return []netip.Prefix{testnet.PodNetworkIPv4, testnet.PodNetworkIPv6}
}

// Close tears the sandbox down: it closes the sockets its probes left
// open, stops the servers, removes the namespaces and then checks that
// nothing of the process (a file descriptor, socket or thread) still
// lives in one of them. It returns what went wrong, leaks included. Close
// the proxiers that run in the sandbox first. Close and [Sandbox.Keep]
// are idempotent, and only the first call of either acts.
func (sb *Sandbox) Close() error { return sb.topo.Close() }

// Keep is [Sandbox.Close] without removing the namespaces: it stops the
// servers and releases the process's handles, and leaves every namespace,
// with its links, addresses, routes and whatever a proxier programmed,
// under [NetNSDir] for inspection, e.g.
//
//	sudo ip netns exec pk-<ID>-node1 nft list ruleset
//
// Nothing answers in the pods any more. [Remove] removes the namespaces
// later.
func (sb *Sandbox) Keep() error { return sb.topo.Detach() }

// Remove removes the namespaces of the sandbox with the given ID, as left
// by [Sandbox.Keep], and returns the names it removed; the ID may be given
// with its "pk-" prefix. A sandbox that is gone already removes nothing
// and is no error.
func Remove(id string) ([]string, error) {
	return testnet.RemoveNamespaces(strings.TrimPrefix(id, "pk-"))
}

// ServerPorts returns the ports every pod serves TCP and UDP on, for IPv4
// and IPv6: 8080, 8081 and 8082.
func ServerPorts() []uint16 {
	return append([]uint16(nil), testnet.ServerPorts...)
}
