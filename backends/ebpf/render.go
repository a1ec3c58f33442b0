package ebpf

import (
	"fmt"
	"math"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// defaultAffinitySec is kube-proxy's ClientIP timeout when a service sets
// none.
const defaultAffinitySec = 10800

// group is an endpoint group: the endpoints one kind of traffic of a
// service port is balanced over, in slot order.
type group struct {
	id  uint32
	eps []netip.AddrPort
	// found counts the group's slots seen in the kernel during a full
	// sync.
	found int

	// maglev says the group's frontends pick with its Maglev table.
	maglev bool
	// sum is the fingerprint of the group's table (when hasSum), to
	// recognize it in the kernel without keeping or rebuilding it.
	sum    uint64
	hasSum bool
	// rowFound says a full sync found the group's table in the kernel.
	rowFound bool
}

// svcState is what one service port holds in the maps.
type svcState struct {
	// groups are the internal group (cluster IP traffic) and, when it
	// differs, the external group (node port, external and
	// load-balancer IPs); nil entries are unused.
	groups [2]*group
	// fes are the service port's frontends with their values.
	fes []feEntry
}

// feEntry is a frontend and its value.
type feEntry struct {
	key feKey
	val svcVal
}

// fe returns the value of frontend k.
func (s *svcState) fe(k feKey) (svcVal, bool) {
	for _, e := range s.fes {
		if e.key == k {
			return e.val, true
		}
	}
	return svcVal{}, false
}

// tables returns how many Maglev tables s uses.
func (s *svcState) tables() int {
	n := 0
	for _, g := range s.groups {
		if g != nil && g.maglev {
			n++
		}
	}
	return n
}

// flagMaglev marks the frontends of groups with a Maglev table.
func (s *svcState) flagMaglev() {
	for i := range s.fes {
		v := &s.fes[i].val
		v.Flags &^= svcMaglev
		for _, g := range s.groups {
			if g != nil && g.id == v.ID && g.maglev {
				v.Flags |= svcMaglev
			}
		}
	}
}

func (s *svcState) slots() int {
	n := 0
	for _, g := range s.groups {
		if g != nil {
			n += len(g.eps)
		}
	}
	return n
}

// group returns the endpoints of s's group id, in slot order; none when
// s is nil or has no such group.
func (s *svcState) group(id uint32) []netip.AddrPort {
	if s == nil {
		return nil
	}
	for _, g := range s.groups {
		if g != nil && g.id == id {
			return g.eps
		}
	}
	return nil
}

// frontend is one address a service port is reached on, and which of
// its groups serves it.
type frontend struct {
	key      feKey
	external bool
	// nodeOnly marks a load-balancer IP with source ranges that only
	// the node's own sockets reach through the maps (svcNodeOnly).
	nodeOnly bool
}

// nodeRanges decides, with north-south at tc or XDP, whether the node's
// own sockets may reach load-balancer IP lb of sp, which has
// loadBalancerSourceRanges (kube-proxy checks the source of the node's
// packets against the ranges). nil: such IPs get no socket frontend.
type nodeRanges func(sp *model.ServicePort, lb netip.Addr) bool

// frontends returns where sp is reached from a local socket. SCTP ports
// have none: the socket programs leave SCTP to the nftables rules.
// Load-balancer IPs with source ranges have none either (the ranges are
// enforced by nftables on the packet path), unless ranged: then they are
// node-only frontends (north-south at tc, where the node's own packets
// pass no program; the pods' do, at their veth).
func frontends(f model.IPFamily, sp *model.ServicePort, ranged bool) []frontend {
	proto := protoNumber(sp.Protocol)
	if proto == 0 {
		return nil
	}
	var out []frontend
	if f.Contains(sp.ClusterIP) {
		out = append(out, frontend{key: feKey{addr: sp.ClusterIP.Unmap(), port: sp.Port, proto: proto}})
	}
	if sp.NodePort != 0 {
		out = append(out, frontend{key: feKey{addr: unspecified(f), port: sp.NodePort, proto: proto}, external: true})
	}
	for _, ip := range sp.ExternalIPs {
		if f.Contains(ip) {
			out = append(out, frontend{key: feKey{addr: ip.Unmap(), port: sp.Port, proto: proto}, external: true})
		}
	}
	nodeOnly := len(sp.LoadBalancerSourceRanges) > 0
	if !nodeOnly || ranged {
		for _, ip := range sp.LoadBalancerIPs {
			if f.Contains(ip) {
				out = append(out, frontend{key: feKey{addr: ip.Unmap(), port: sp.Port, proto: proto}, external: true, nodeOnly: nodeOnly})
			}
		}
	}
	return out
}

func unspecified(f model.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// targetLists returns the endpoints of the internal and external groups.
// Local sockets reaching an external address of a service with
// externalTrafficPolicy Local use the short-circuit endpoints
// (proxier.Targets.ShortCircuit: the cluster-wide ones), as kube-proxy
// does for pods and the node itself; with policy Cluster, the external
// targets.
func targetLists(sp *model.ServicePort, t *proxier.Targets) (internal, external []netip.AddrPort) {
	internal = addrs(t.Internal)
	if sp.ExternalLocal() {
		if t.Cluster != nil {
			return internal, addrs(t.Cluster)
		}
		return internal, internal
	}
	if slices.Equal(t.Internal, t.External) {
		return internal, internal
	}
	return internal, addrs(t.External)
}

// smallSet is the size up to which a linear search beats a map.
const smallSet = 32

// addrs returns the distinct endpoint addresses of eps, in order.
func addrs(eps []*model.Endpoint) []netip.AddrPort { return model.DistinctAddrs(eps, nil) }

// addrSet is a set of endpoints: a slice while small, a map beyond.
type addrSet struct {
	list []netip.AddrPort
	m    map[netip.AddrPort]bool
}

func newAddrSet(list []netip.AddrPort) addrSet {
	if len(list) <= smallSet {
		return addrSet{list: list}
	}
	m := make(map[netip.AddrPort]bool, len(list))
	for _, a := range list {
		m[a] = true
	}
	return addrSet{m: m}
}

func (s addrSet) has(a netip.AddrPort) bool {
	if s.m != nil {
		return s.m[a]
	}
	return slices.Contains(s.list, a)
}

// layout places want into slots, keeping every endpoint of prev that
// stays in its slot: a removed endpoint's slot is taken by the last one,
// new endpoints are appended. Slots stay compact (0..len-1).
func layout(prev, want []netip.AddrPort) []netip.AddrPort {
	if len(prev) == 0 {
		return slices.Clone(want)
	}
	if slices.Equal(prev, want) {
		return prev
	}
	keep := newAddrSet(want)
	out := slices.Clone(prev)
	trim := func() {
		for len(out) > 0 && !keep.has(out[len(out)-1]) {
			out = out[:len(out)-1]
		}
	}
	trim()
	for i := 0; i < len(out); i++ {
		if !keep.has(out[i]) {
			out[i] = out[len(out)-1]
			out = out[:len(out)-1]
			trim()
		}
	}
	have := newAddrSet(slices.Clone(out))
	for _, a := range want {
		if !have.has(a) {
			out = append(out, a)
		}
	}
	return out
}

// affinitySec returns the affinity timeout of sp in whole seconds, 0
// without affinity.
func affinitySec(sp *model.ServicePort) uint32 {
	if !sp.SessionAffinity {
		return 0
	}
	if sp.AffinityTimeout <= 0 {
		return defaultAffinitySec
	}
	s := math.Ceil(sp.AffinityTimeout.Seconds())
	return uint32(min(s, math.MaxUint32))
}

// idAllocator hands out endpoint group ids. Ids are never reused while
// the process runs, so affinity entries of a deleted group never apply
// to a new one.
type idAllocator struct{ next uint32 }

func (a *idAllocator) alloc() (uint32, error) {
	if a.next == math.MaxUint32 {
		return 0, fmt.Errorf("endpoint group ids exhausted")
	}
	if a.next == 0 {
		a.next = 1
	}
	id := a.next
	a.next++
	return id, nil
}

// render computes the state of one service port. prev is its previous
// state (nil: none), whose group ids and slot layout are kept.
func render(f model.IPFamily, sp *model.ServicePort, t *proxier.Targets, prev *svcState, ids *idAllocator) (*svcState, error) {
	return renderRanged(f, sp, t, prev, ids, nil)
}

// renderRanged is render that, with node set (north-south at tc or
// XDP), gives each load-balancer IP with source ranges a node-only
// frontend: the external group when node admits the node's sockets,
// else a drop (EPERM).
func renderRanged(f model.IPFamily, sp *model.ServicePort, t *proxier.Targets, prev *svcState, ids *idAllocator, node nodeRanges) (*svcState, error) {
	fes := frontends(f, sp, node != nil)
	s := &svcState{fes: make([]feEntry, 0, len(fes))}
	if len(fes) == 0 {
		return s, nil
	}
	if t == nil {
		t = &proxier.Targets{}
	}
	internal, external := targetLists(sp, t)
	lists := [2][]netip.AddrPort{internal, external}
	used := [2]bool{}
	for _, fe := range fes {
		if fe.external && !slices.Equal(internal, external) {
			used[1] = true
		} else {
			used[0] = true
		}
	}
	for i := range s.groups {
		if !used[i] {
			continue
		}
		g := &group{}
		var prevEps []netip.AddrPort
		if prev != nil && prev.groups[i] != nil {
			g.id, prevEps = prev.groups[i].id, prev.groups[i].eps
		} else {
			id, err := ids.alloc()
			if err != nil {
				return nil, err
			}
			g.id = id
		}
		if len(prevEps) == 0 {
			// A new group: the list is this render's own (addrs).
			g.eps = lists[i]
		} else {
			g.eps = layout(prevEps, lists[i])
		}
		s.groups[i] = g
	}
	aff := affinitySec(sp)
	for _, fe := range fes {
		g := s.groups[0]
		if fe.external && s.groups[1] != nil {
			g = s.groups[1]
		}
		v := svcVal{ID: g.id, Count: uint32(len(g.eps)), AffinitySec: aff}
		if len(g.eps) == 0 && t.HasEndpoints {
			v.Flags = svcDrop
		}
		if fe.nodeOnly {
			v.Flags |= svcNodeOnly
			if !node(sp, fe.key.addr) {
				// Outside the ranges: kube-proxy drops the
				// node's packets, whatever the endpoints.
				v.Count, v.Flags = 0, svcDrop|svcNodeOnly
			}
		}
		if _, dup := s.fe(fe.key); !dup {
			s.fes = append(s.fes, feEntry{fe.key, v})
		}
	}
	return s, nil
}
