package testnet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// The pod networks of the whole cluster, the ClusterCIDRs of a proxier
// running in the topology.
var (
	PodNetworkIPv4 = netip.MustParsePrefix("10.244.0.0/16")
	PodNetworkIPv6 = netip.MustParsePrefix("fd00:10:244::/48")
)

// PodNetwork returns the cluster's pod network of family f.
func PodNetwork(f model.IPFamily) netip.Prefix {
	if f == model.IPv6 {
		return PodNetworkIPv6
	}
	return PodNetworkIPv4
}

// Node names.
const (
	Node1Name = "node1"
	Node2Name = "node2"
)

// Options shape a topology. The zero value builds the default one.
type Options struct {
	// Node1Pods and Node2Pods are the numbers of pods behind node1 and
	// node2; zero means 3 and 2. At most 200 each.
	Node1Pods, Node2Pods int
	// ClientToNode2 links the client to node2 too (node2's interface
	// "client", the client's "eth1"), and routes node2's packets to the
	// client's addresses over it: node2 reaches the client without
	// node1, as with direct server return. The client still reaches
	// every service through node1.
	ClientToNode2 bool
}

// Host is one namespace of the topology with its primary addresses.
type Host struct {
	*NS
	// Name is the host's name: "node1", "node2", "client", "uplink" or a
	// pod's name such as "node1-pod2". (The namespace's own name is
	// NS.Name().)
	Name string
	// IPv4 and IPv6 are the host's primary addresses: a pod's own address,
	// a node's internal address (on the node1-node2 link), the client's
	// address.
	IPv4, IPv6 netip.Addr
}

// IP returns the host's primary address of family f.
func (h *Host) IP(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return h.IPv6
	}
	return h.IPv4
}

// Node is a node namespace: it routes to its pods.
type Node struct {
	Host
	// ExternalIPv4 and ExternalIPv6 are the node's addresses toward the
	// client: node1's, and node2's with Options.ClientToNode2 (else
	// invalid).
	ExternalIPv4, ExternalIPv6 netip.Addr
	// UplinkIPv4 and UplinkIPv6 are node1's addresses toward the uplink,
	// where its default route points; invalid for node2.
	UplinkIPv4, UplinkIPv6 netip.Addr
	// PodCIDRv4 and PodCIDRv6 are the node's pod networks.
	PodCIDRv4, PodCIDRv6 netip.Prefix
	// Pods are the pods behind the node.
	Pods []*Pod
}

// ExternalIP returns the node's address toward the client, of family f;
// invalid for node2.
func (n *Node) ExternalIP(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return n.ExternalIPv6
	}
	return n.ExternalIPv4
}

// UplinkIP returns node1's address toward the uplink, of family f:
// the source of its own packets to addresses it has no specific route for
// (service addresses among them) unless they are masqueraded. Invalid for
// node2.
func (n *Node) UplinkIP(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return n.UplinkIPv6
	}
	return n.UplinkIPv4
}

// Addrs returns every address of family f the node holds on its
// links to other hosts (not the pod gateways).
func (n *Node) Addrs(f model.IPFamily) []netip.Addr {
	out := []netip.Addr{n.IP(f)}
	for _, a := range []netip.Addr{n.ExternalIP(f), n.UplinkIP(f)} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// PodCIDR returns the node's pod network of family f.
func (n *Node) PodCIDR(f model.IPFamily) netip.Prefix {
	if f == model.IPv6 {
		return n.PodCIDRv6
	}
	return n.PodCIDRv4
}

// Gateway returns the address of family f the node holds on every pod
// veth: what a pod sees as the source of hairpin traffic masqueraded by
// the node.
func (n *Node) Gateway(f model.IPFamily) netip.Addr {
	return n.PodCIDR(f).Addr().Next()
}

// Pod is a pod namespace behind a node, running the servers.
type Pod struct {
	Host
	// Node is the node the pod runs behind.
	Node *Node
	srv  *servers
}

// Topology is a set of namespaces built by [New].
type Topology struct {
	// ID is the random part of every namespace name.
	ID string
	// Node1 runs the proxier under test; Node2 holds remote endpoints.
	Node1, Node2 *Node
	// Client is outside the cluster, behind node1.
	Client *Host
	// Uplink is where node1's default route points: it answers nothing
	// and forwards nothing, so a packet node1 routes there is dropped
	// silently.
	Uplink *Host
	// Pods are all pods, node1's first.
	Pods []*Pod

	nss     []*NS
	handles map[*NS]*netlink.Handle

	sctpMu      sync.Mutex
	sctpWaiters map[uint32]chan Reply

	closeOnce sync.Once
	closeErr  error
}

// New builds a topology and registers its teardown with tb.Cleanup. It
// calls [RequireRoot] first and fails the test if the topology cannot be
// built. Outside tests, use [Build].
func New(tb testing.TB, opts Options) *Topology {
	tb.Helper()
	RequireRoot(tb)
	start := time.Now()
	t, err := Build(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := t.Close(); err != nil {
			tb.Errorf("testnet teardown: %v", err)
		}
	})
	tb.Logf("testnet: topology pk-%s (%d namespaces) built in %v", t.ID, len(t.nss), time.Since(start).Round(time.Millisecond))
	return t
}

// Build builds a topology for a program that is not a test, such as a
// demo. The caller must call [Topology.Close] (or [Topology.Detach]) when
// done, also after a failure elsewhere; Build itself removes whatever it
// created when it fails. Without the privilege to create namespaces it
// fails with an error matching [ErrNotPrivileged].
func Build(opts Options) (*Topology, error) {
	if err := checkPrivilege(); err != nil {
		return nil, fmt.Errorf("testnet: %w: %v", ErrNotPrivileged, err)
	}
	if opts.Node1Pods == 0 {
		opts.Node1Pods = 3
	}
	if opts.Node2Pods == 0 {
		opts.Node2Pods = 2
	}
	if opts.Node1Pods < 0 || opts.Node1Pods > 200 || opts.Node2Pods < 0 || opts.Node2Pods > 200 {
		return nil, fmt.Errorf("testnet: invalid pod counts %d, %d", opts.Node1Pods, opts.Node2Pods)
	}
	var id [4]byte
	rand.Read(id[:])
	t := &Topology{
		ID:          hex.EncodeToString(id[:]),
		handles:     map[*NS]*netlink.Handle{},
		sctpWaiters: map[uint32]chan Reply{},
	}
	defer func() {
		// A panic while building leaves nothing behind either.
		if r := recover(); r != nil {
			t.Close()
			panic(r)
		}
	}()
	if err := t.build(opts); err != nil {
		err = fmt.Errorf("testnet: build topology pk-%s: %w", t.ID, err)
		if cerr := t.Close(); cerr != nil {
			err = fmt.Errorf("%w; teardown: %v", err, cerr)
		}
		return nil, err
	}
	return t, nil
}

// Namespaces returns every namespace of the topology.
func (t *Topology) Namespaces() []*NS { return append([]*NS(nil), t.nss...) }

// Pod returns the pod with the given name, or nil.
func (t *Topology) Pod(name string) *Pod {
	for _, p := range t.Pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Close tears the topology down: it closes client sockets handed out by
// the namespaces, stops the servers, removes the namespaces and then
// checks that nothing of the process (file descriptor, socket, thread)
// still lives in one of them. It returns what went wrong, leaks included.
// Close is idempotent; New registers it with t.Cleanup.
func (t *Topology) Close() error {
	t.closeOnce.Do(func() { t.closeErr = t.close(false) })
	return t.closeErr
}

// Detach is [Topology.Close] without removing the namespaces: it closes
// the client sockets, stops the servers and releases the process's
// handles, and leaves every namespace, with its interfaces, addresses,
// routes and whatever a proxier programmed, mounted under [NetNSDir] for
// inspection (`ip netns exec pk-ID-node1 nft list ruleset`). Nothing
// answers in the pods any more. [RemoveNamespaces] removes them later.
// Close and Detach are idempotent and only the first call of either acts.
func (t *Topology) Detach() error {
	t.closeOnce.Do(func() { t.closeErr = t.close(true) })
	return t.closeErr
}

// RemoveNamespaces removes the namespaces of the topology with the given
// ID, as left by [Topology.Detach]. It returns the names it removed.
func RemoveNamespaces(id string) ([]string, error) {
	if id == "" || strings.ContainsAny(id, "/*?[") {
		return nil, fmt.Errorf("testnet: invalid topology ID %q", id)
	}
	m, err := filepath.Glob(filepath.Join(NetNSDir, "pk-"+id+"-*"))
	if err != nil {
		return nil, err
	}
	var names []string
	var errs []error
	for _, p := range m {
		if err := removeNS(p); err != nil {
			errs = append(errs, err)
			continue
		}
		names = append(names, filepath.Base(p))
	}
	return names, errors.Join(errs...)
}

func (t *Topology) close(keep bool) error {
	var errs []error
	for _, ns := range t.nss {
		ns.closeTracked()
	}
	for _, p := range t.Pods {
		if p.srv != nil {
			if err := p.srv.stop(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			}
		}
	}
	for _, h := range t.handles {
		h.Close()
	}
	if keep {
		for _, ns := range t.nss {
			if err := ns.ns.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	inos := map[uint64]string{}
	for _, ns := range t.nss {
		inos[ns.ino] = ns.name
		if err := ns.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	if leaks := waitNoLeaks(inos, 3*time.Second); len(leaks) > 0 {
		errs = append(errs, fmt.Errorf("leaked into the torn-down namespaces: %s", strings.Join(leaks, "; ")))
	}
	if m, _ := filepath.Glob(filepath.Join(NetNSDir, "pk-"+t.ID+"-*")); len(m) > 0 {
		errs = append(errs, fmt.Errorf("namespace files left: %v", m))
	}
	return errors.Join(errs...)
}

func (t *Topology) newNS(host string) (*NS, error) {
	ns, err := createNS("pk-" + t.ID + "-" + host)
	if err != nil {
		return nil, err
	}
	ns.topo = t
	t.nss = append(t.nss, ns)
	return ns, nil
}

// sysctls every namespace gets before its interfaces exist, so the
// defaults apply to them.
var baseSysctls = [][2]string{
	{"net/ipv6/conf/all/accept_dad", "0"},
	{"net/ipv6/conf/default/accept_dad", "0"},
	{"net/ipv4/conf/all/rp_filter", "0"},
	{"net/ipv4/conf/default/rp_filter", "0"},
}

var routerSysctls = [][2]string{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv6/conf/all/forwarding", "1"},
}

func (t *Topology) build(opts Options) error {
	if err := t.createHosts(opts); err != nil {
		return err
	}
	for _, ns := range t.nss {
		router := ns == t.Node1.NS || ns == t.Node2.NS
		if err := t.prepare(ns, router); err != nil {
			return err
		}
	}
	if err := t.wireHosts(opts); err != nil {
		return err
	}
	for _, node := range []*Node{t.Node1, t.Node2} {
		for i, p := range node.Pods {
			if err := t.wirePod(p, fmt.Sprintf("pod%d", i+1)); err != nil {
				return err
			}
		}
	}
	if err := t.waitAddrsReady(addrsReadyTimeout); err != nil {
		return err
	}
	for _, p := range t.Pods {
		srv, err := startServers(p)
		if err != nil {
			return fmt.Errorf("servers in %s: %w", p.Name, err)
		}
		p.srv = srv
	}
	return nil
}

// addrsReadyTimeout bounds the wait for the IPv6 addresses to be usable.
const addrsReadyTimeout = 20 * time.Second

// waitAddrsReady waits until every IPv6 address of every namespace is
// usable: no longer tentative, with its route in the local table. The
// kernel finishes an IPv6 address only once the link has carrier, which
// it learns asynchronously (the link watch work runs up to a second
// later, later still under load), even with DAD off. Until then
// connections from or to the address fail, and a snapshot of the routes
// taken then differs from a later one.
func (t *Topology) waitAddrsReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, ns := range t.nss {
		for {
			pending, err := t.pendingAddrs(ns)
			switch {
			case errors.Is(err, netlink.ErrDumpInterrupted):
				// The addresses changed during the dump: look again.
				pending = []string{"(dump interrupted)"}
			case err != nil:
				return fmt.Errorf("addresses of %s: %w", ns.name, err)
			}
			if len(pending) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("addresses of %s not usable after %v: %v", ns.name, timeout, pending)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// localRoute is a route of the local table: its type, device and
// destination.
type localRoute struct {
	typ  int
	link int
	dst  netip.Addr
}

// pendingAddrs lists what the kernel has yet to add to ns for its IPv6
// addresses. Per link that is up: the link-local address it generates
// (addr_gen_mode 0) once it learns of the carrier; the local route of
// every address, of that link (node1 holds the same gateway addresses
// on every pod link: the route of one does not make the others usable);
// and, where the link forwards, the subnet-router anycast route of every
// prefix shorter than /127, which the kernel adds right after the local
// route.
func (t *Topology) pendingAddrs(ns *NS) ([]string, error) {
	h := t.handles[ns]
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	have := map[localRoute]bool{}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			have[localRoute{r.Type, r.LinkIndex, a}] = true
		}
	}
	byLink := map[int][]netlink.Addr{}
	for _, a := range addrs {
		byLink[a.LinkIndex] = append(byLink[a.LinkIndex], a)
	}
	var pending []string
	for _, l := range links {
		attrs := l.Attrs()
		if attrs.Flags&net.FlagUp == 0 {
			continue
		}
		forwarding := false
		if attrs.Flags&net.FlagLoopback == 0 {
			conf := func(key string) (string, error) { return ns.Sysctl("net/ipv6/conf/" + attrs.Name + "/" + key) }
			mode, err := conf("addr_gen_mode")
			if err != nil {
				return nil, err
			}
			if ll, ok := eui64LinkLocal(attrs.HardwareAddr); ok && mode == "0" &&
				!slices.ContainsFunc(byLink[attrs.Index], func(a netlink.Addr) bool { return a.IP.Equal(ll.AsSlice()) }) {
				pending = append(pending, fmt.Sprintf("link-local %s of %s", ll, attrs.Name))
			}
			fwd, err := conf("forwarding")
			if err != nil {
				return nil, err
			}
			forwarding = fwd == "1"
		}
		for _, a := range byLink[attrs.Index] {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			if a.Flags&unix.IFA_F_TENTATIVE != 0 || !have[localRoute{unix.RTN_LOCAL, attrs.Index, ip}] {
				pending = append(pending, fmt.Sprintf("%s on %s", a.IPNet, attrs.Name))
				continue
			}
			if bits, _ := a.Mask.Size(); forwarding && bits < 127 {
				if p, err := ip.Prefix(bits); err == nil && !have[localRoute{unix.RTN_ANYCAST, attrs.Index, p.Addr()}] {
					pending = append(pending, fmt.Sprintf("anycast %s on %s", p.Addr(), attrs.Name))
				}
			}
		}
	}
	return pending, nil
}

// eui64LinkLocal returns the link-local address the kernel generates for
// an Ethernet address with addr_gen_mode 0.
func eui64LinkLocal(mac net.HardwareAddr) (netip.Addr, bool) {
	if len(mac) != 6 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 2, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]}), true
}

// createHosts creates the namespaces and fills in the hosts' addresses.
func (t *Topology) createHosts(opts Options) error {
	hosts := map[string]*NS{}
	for _, name := range []string{Node1Name, Node2Name, "client", "uplink"} {
		ns, err := t.newNS(name)
		if err != nil {
			return err
		}
		hosts[name] = ns
	}
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	t.Node1 = &Node{
		Host:         Host{NS: hosts[Node1Name], Name: Node1Name, IPv4: a("192.0.2.1"), IPv6: a("2001:db8:2::1")},
		ExternalIPv4: a("198.51.100.1"),
		ExternalIPv6: a("2001:db8:1::1"),
		UplinkIPv4:   a("10.255.0.1"),
		UplinkIPv6:   a("2001:db8:3::1"),
		PodCIDRv4:    p("10.244.1.0/24"),
		PodCIDRv6:    p("fd00:10:244:1::/64"),
	}
	t.Node2 = &Node{
		Host:      Host{NS: hosts[Node2Name], Name: Node2Name, IPv4: a("192.0.2.2"), IPv6: a("2001:db8:2::2")},
		PodCIDRv4: p("10.244.2.0/24"),
		PodCIDRv6: p("fd00:10:244:2::/64"),
	}
	t.Client = &Host{NS: hosts["client"], Name: "client", IPv4: a("198.51.100.2"), IPv6: a("2001:db8:1::2")}
	t.Uplink = &Host{NS: hosts["uplink"], Name: "uplink", IPv4: a("10.255.0.2"), IPv6: a("2001:db8:3::2")}
	for _, n := range []struct {
		node  *Node
		count int
	}{{t.Node1, opts.Node1Pods}, {t.Node2, opts.Node2Pods}} {
		for i := 1; i <= n.count; i++ {
			name := fmt.Sprintf("%s-pod%d", n.node.Name, i)
			ns, err := t.newNS(name)
			if err != nil {
				return err
			}
			pod := &Pod{
				Host: Host{NS: ns, Name: name, IPv4: nthAddr(n.node.PodCIDRv4, i+1), IPv6: nthAddr(n.node.PodCIDRv6, i+1)},
				Node: n.node,
			}
			n.node.Pods = append(n.node.Pods, pod)
			t.Pods = append(t.Pods, pod)
		}
	}
	return nil
}

// prepare sets a namespace's sysctls (before any interface exists, so
// the defaults apply to them), opens its netlink handle and brings lo up.
func (t *Topology) prepare(ns *NS, router bool) error {
	kv := baseSysctls
	if router {
		kv = append(append([][2]string(nil), kv...), routerSysctls...)
	}
	if err := ns.setSysctls(kv); err != nil {
		return err
	}
	h, err := ns.netlink()
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", ns.name, err)
	}
	t.handles[ns] = h
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("lo up in %s: %w", ns.name, err)
	}
	return nil
}

// wireHosts links node1 to the client, node2 and the uplink, and sets
// the hosts' addresses and routes.
func (t *Topology) wireHosts(opts Options) error {
	n1, n2, cl, up := t.Node1, t.Node2, t.Client, t.Uplink
	// node1's default route goes to a separate uplink, not back to the
	// client: forwarding a packet out of the interface it came in on
	// makes the kernel send a redirect, which uses up the ICMP rate
	// limit token of the client, so a reject's ICMP error right after it
	// would be suppressed.
	for _, l := range []struct {
		peer           *NS
		name, peerName string
	}{{cl.NS, "client", "eth0"}, {n2.NS, Node2Name, Node1Name}, {up.NS, "uplink", "eth0"}} {
		if err := t.veth(n1.NS, l.name, l.peer, l.peerName); err != nil {
			return err
		}
	}
	h1, h2, hc, hu := t.handles[n1.NS], t.handles[n2.NS], t.handles[cl.NS], t.handles[up.NS]
	pfx := func(a netip.Addr) string {
		if a.Is4() {
			return a.String() + "/24"
		}
		return a.String() + "/64"
	}
	if opts.ClientToNode2 {
		if err := t.wireClientToNode2(pfx); err != nil {
			return err
		}
	}
	return errors.Join(
		addAddrs(h1, "client", pfx(n1.ExternalIPv4), pfx(n1.ExternalIPv6)),
		addAddrs(hc, "eth0", pfx(cl.IPv4), pfx(cl.IPv6)),
		addAddrs(h1, Node2Name, pfx(n1.IPv4), pfx(n1.IPv6)),
		addAddrs(h2, Node1Name, pfx(n2.IPv4), pfx(n2.IPv6)),
		addAddrs(h1, "uplink", pfx(n1.UplinkIPv4), pfx(n1.UplinkIPv6)),
		addAddrs(hu, "eth0", pfx(up.IPv4), pfx(up.IPv6)),
		addRoute(hc, "eth0", "0.0.0.0/0", n1.ExternalIPv4.String()),
		addRoute(hc, "eth0", "::/0", n1.ExternalIPv6.String()),
		addRoute(h1, Node2Name, n2.PodCIDRv4.String(), n2.IPv4.String()),
		addRoute(h1, Node2Name, n2.PodCIDRv6.String(), n2.IPv6.String()),
		addRoute(h1, "uplink", "0.0.0.0/0", up.IPv4.String()),
		addRoute(h1, "uplink", "::/0", up.IPv6.String()),
		addRoute(h2, Node1Name, "0.0.0.0/0", n1.IPv4.String()),
		addRoute(h2, Node1Name, "::/0", n1.IPv6.String()),
	)
}

// wireClientToNode2 links node2 to the client (Options.ClientToNode2)
// on a network of its own, with node2's routes to the client's
// addresses over it.
func (t *Topology) wireClientToNode2(pfx func(netip.Addr) string) error {
	n2, cl := t.Node2, t.Client
	if err := t.veth(n2.NS, "client", cl.NS, "eth1"); err != nil {
		return err
	}
	clientSide4, clientSide6 := netip.MustParseAddr("10.254.0.2"), netip.MustParseAddr("2001:db8:4::2")
	n2.ExternalIPv4, n2.ExternalIPv6 = netip.MustParseAddr("10.254.0.1"), netip.MustParseAddr("2001:db8:4::1")
	h2, hc := t.handles[n2.NS], t.handles[cl.NS]
	return errors.Join(
		addAddrs(h2, "client", pfx(n2.ExternalIPv4), pfx(n2.ExternalIPv6)),
		addAddrs(hc, "eth1", pfx(clientSide4), pfx(clientSide6)),
		addRoute(h2, "client", cl.IPv4.String()+"/32", clientSide4.String()),
		addRoute(h2, "client", cl.IPv6.String()+"/128", clientSide6.String()),
	)
}

// wirePod connects a pod to its node with a routed veth, named ifname on
// the node's side.
func (t *Topology) wirePod(p *Pod, ifname string) error {
	node := p.Node
	hn, hp := t.handles[node.NS], t.handles[p.NS]
	if err := t.veth(node.NS, ifname, p.NS, "eth0"); err != nil {
		return err
	}
	gw4, gw6 := node.Gateway(model.IPv4), node.Gateway(model.IPv6)
	return errors.Join(
		addAddrs(hn, ifname, gw4.String()+"/32", gw6.String()+"/128", "fe80::1/64"),
		addRoute(hn, ifname, p.IPv4.String()+"/32", ""),
		addRoute(hn, ifname, p.IPv6.String()+"/128", ""),
		addAddrs(hp, "eth0", p.IPv4.String()+"/32", p.IPv6.String()+"/128"),
		addRoute(hp, "eth0", gw4.String()+"/32", ""),
		addRoute(hp, "eth0", "0.0.0.0/0", gw4.String()),
		addRoute(hp, "eth0", "::/0", "fe80::1"),
	)
}

// veth creates a veth pair from namespace a (name) to b (peer), both up.
func (t *Topology) veth(a *NS, name string, b *NS, peer string) error {
	ha, hb := t.handles[a], t.handles[b]
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(b.ns.Fd()),
	}
	if err := ha.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s/%s - %s/%s: %w", a.name, name, b.name, peer, err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
	}{{ha, name}, {hb, peer}} {
		l, err := x.h.LinkByName(x.name)
		if err == nil {
			err = x.h.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("set %s up: %w", x.name, err)
		}
	}
	return nil
}

func addAddrs(h *netlink.Handle, ifname string, prefixes ...string) error {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("link %s: %w", ifname, err)
	}
	for _, s := range prefixes {
		p := netip.MustParsePrefix(s)
		a := &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s to %s: %w", s, ifname, err)
		}
	}
	return nil
}

// addRoute adds a route to dst out of ifname, via gw when not empty.
func addRoute(h *netlink.Handle, ifname, dst, gw string) error {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("link %s: %w", ifname, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(netip.MustParsePrefix(dst))}
	if gw != "" {
		r.Gw = netip.MustParseAddr(gw).AsSlice()
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %q dev %s: %w", dst, gw, ifname, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nthAddr returns the n-th address of p.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a
}

func (n *NS) setSysctls(kv [][2]string) error {
	return n.Do(func() error {
		for _, x := range kv {
			if err := os.WriteFile(filepath.Join("/proc/sys", x[0]), []byte(x[1]), 0); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", x[0], n.name, err)
			}
		}
		return nil
	})
}
