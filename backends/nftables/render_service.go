package nftables

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file renders one service port: its dispatch keys, its source
// ranges, the balancing of its cluster traffic and of its external
// traffic (node port, external and load-balancer IPs).
//
// A group of endpoints is balanced from a shared chain when the packet's
// destination names its range set (see tupleRule): cluster traffic, and
// external traffic with policy Cluster, without session affinity. Other
// groups get a chain of their own (svc-… for cluster traffic, ext-… for
// external traffic, all-… for the short circuit of a service with both
// policies Local and affinity).

// svcAlloc is what rendering a service port takes from the backend's
// state.
type svcAlloc struct {
	// id is the service port's id, which picks its shard.
	id uint32
	// prev is its previous rendering (nil: none), whose endpoint order
	// and affinity ids stay where they can.
	prev *svcObjs
	// newAID allocates an affinity id.
	newAID func() uint32
	// taken says which range set prefixes other service ports hold.
	taken prefixTaken
}

// svcRender is the rendering of one service port in progress: what its
// parts share.
type svcRender struct {
	*renderer
	sp *model.ServicePort
	a  svcAlloc
	o  *svcObjs
	// The service port's dispatch keys: its cluster IP's, its external
	// and load-balancer addresses' (without repeats) and its node port's.
	clusterKey      []byte
	extAddrs        []netip.Addr
	extKeys, lbKeys [][]byte
	npKey           []byte
	// Balancing: the shard and the part of its endpoint maps (epMap)
	// that hold the service port's range sets.
	shard     uint32
	part      uint32
	epMap     string
	affinity  time.Duration
	prevSlots [numGroups][]netip.AddrPort
	prevAIDs  [numGroups][]uint32
	// used holds the range set prefixes this service port uses.
	used map[string]bool
	// clusterPrefix is the internal group's prefix, when shared.
	clusterPrefix []byte
	// encErr is the first error encoding a rule.
	encErr error
}

// service renders one service port (see svcAlloc for a).
func (r *renderer) service(name model.ServicePortName, sp *model.ServicePort, t *proxier.Targets, a svcAlloc) (*svcObjs, error) {
	if !sp.Protocol.Valid() {
		return nil, fmt.Errorf("unsupported protocol %q", sp.Protocol)
	}
	if len(svcChain(name)) > maxChainName {
		return nil, errors.New("name too long for an nftables chain")
	}
	if t == nil {
		t = &proxier.Targets{}
	}
	s := &svcRender{renderer: r, sp: sp, a: a, o: &svcObjs{}}
	if err := s.keys(); err != nil {
		return nil, err
	}
	s.firewall()
	if !t.HasEndpoints {
		noEndpoints(s.add, s.clusterKey, s.extKeys, s.npKey, &verdict{Code: unix.NFT_GOTO, Chain: chainReject})
		return s.o, nil
	}
	internal, externalEps := r.endpoints(t.Internal), []netip.AddrPort(nil)
	if sameList(t.External, t.Internal) {
		externalEps = internal // policy Cluster: the same list
	} else {
		externalEps = r.endpoints(t.External)
	}
	for _, eps := range [][]netip.AddrPort{internal, externalEps} {
		if len(eps) > randRange {
			return nil, fmt.Errorf("%d endpoints, more than %d", len(eps), randRange)
		}
	}
	s.shard, _ = groupOf(a.id, 0)
	s.part = r.partOf(a.id)
	s.epMap = endpointsMap(s.shard, s.part)
	if a.prev != nil {
		s.prevSlots, s.prevAIDs = a.prev.slots, a.prev.aids
	}
	if sp.SessionAffinity {
		s.affinity = sp.AffinityTimeout.Truncate(time.Second)
		if s.affinity <= 0 {
			s.affinity = model.DefaultAffinityTimeout
		}
	}
	s.used = map[string]bool{}
	s.cluster(name, internal)
	if sp.ExternallyAccessible() {
		var wide []netip.AddrPort
		if t.Cluster != nil {
			wide = r.endpoints(t.Cluster)
		}
		s.external(name, internal, externalEps, wide, t.Cluster != nil)
	}
	return s.o, s.encErr
}

// add adds an element of a fixed set.
func (s *svcRender) add(set string, e elem) { s.o.fixed = append(s.o.fixed, setElem{set: set, e: e}) }

// enc encodes a rule, recording the first failure.
func (s *svcRender) enc(ru rule) []byte {
	b, err := encodeExprs(s.fi.proto, ru)
	if err != nil && s.encErr == nil {
		s.encErr = err
	}
	return b
}

func goToV(chain string) *verdict { return &verdict{Code: unix.NFT_GOTO, Chain: chain} }

// keys checks the service port's addresses and computes its dispatch
// keys.
func (s *svcRender) keys() error {
	fi, sp := &s.fi, s.sp
	if sp.ClusterIP.IsValid() {
		if !fi.fam.Contains(sp.ClusterIP) {
			return fmt.Errorf("cluster IP %s is not %s", sp.ClusterIP, fi.fam)
		}
		if sp.Port == 0 {
			return errors.New("port 0")
		}
		s.clusterKey = fi.ipKey(sp.ClusterIP, sp.Protocol, sp.Port)
		s.add(setClusterIPs, elem{Key: fi.Addr(sp.ClusterIP)})
	}
	for i, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if !fi.fam.Contains(a) {
			return fmt.Errorf("address %s is not %s", a, fi.fam)
		}
		if sp.Port == 0 {
			return errors.New("port 0")
		}
		k := fi.ipKey(a, sp.Protocol, sp.Port)
		if slices.ContainsFunc(s.extKeys, func(o []byte) bool { return bytes.Equal(o, k) }) {
			continue
		}
		s.extKeys = append(s.extKeys, k)
		s.extAddrs = append(s.extAddrs, a)
		if i >= len(sp.ExternalIPs) {
			s.lbKeys = append(s.lbKeys, k)
		}
	}
	if sp.NodePort != 0 {
		s.npKey = nftnl.PortKey(sp.Protocol, sp.NodePort)
	}
	return nil
}

// firewall adds the source ranges of the load-balancer IPs, whatever the
// endpoints.
func (s *svcRender) firewall() {
	fi, sp := &s.fi, s.sp
	if len(sp.LoadBalancerSourceRanges) == 0 {
		return
	}
	ranges := normalizeRanges(fi.fam, sp.LoadBalancerSourceRanges)
	if sp.SourceRangesHold(s.nodeIP) {
		for _, a := range sp.LoadBalancerIPs {
			if fi.fam.Contains(a) {
				ranges = append(ranges, [2]netip.Addr{a.Unmap(), a.Unmap()})
			}
		}
	}
	for _, k := range s.lbKeys {
		s.add(setFirewallIPs, elem{Key: k})
		for _, rg := range ranges {
			s.add(setFirewallAllow, elem{Key: concat(k, fi.Addr(rg[0])), KeyEnd: concat(k, fi.Addr(rg[1]))})
		}
	}
}

// free reports whether the range set prefixes are free: none is nil,
// used twice by this service port (an IPv6 hash collision) or held by
// another one. A prefix that is not makes its group use a chain of its
// own.
func (s *svcRender) free(prefixes ...[]byte) bool {
	seen := map[string]bool{}
	for _, p := range prefixes {
		if p == nil || s.used[string(p)] || seen[string(p)] || s.a.taken(s.epMap, p) {
			return false
		}
		seen[string(p)] = true
	}
	return true
}

// ranges places group which's endpoints under prefix in the shard's
// endpoint map.
func (s *svcRender) ranges(prefix []byte, which uint32) {
	s.used[string(prefix)] = true
	s.o.ranges = append(s.o.ranges, rangeSpec{set: s.epMap, prefix: prefix, group: uint8(which)})
	s.o.uses(shardRef{kind: objEndpoints, shard: s.shard, part: s.part})
}

// toShared is a verdict to the shard's shared chain of a kind.
func (s *svcRender) toShared(kind shardObjKind) *verdict {
	ref := shardRef{kind: kind, shard: s.shard}
	s.o.uses(ref)
	return goToV(ref.name())
}

// slotsOf orders group which's endpoints, keeping the previous order
// where it can.
func (s *svcRender) slotsOf(which uint32, eps []netip.AddrPort) []netip.AddrPort {
	slots := stableSlots(s.prevSlots[which], eps)
	if which != 0 && slices.Equal(slots, s.o.slots[0]) {
		slots = s.o.slots[0] // one copy when the groups agree
	}
	s.o.slots[which] = slots
	return slots
}

// ownGroup returns the rules that balance group which over slots from a
// chain of its own.
func (s *svcRender) ownGroup(which uint32, slots []netip.AddrPort) [][]byte {
	fi := &s.fi
	if s.affinity == 0 {
		p := ownGroupPrefix(s.a.id, which)
		s.ranges(p, which)
		return [][]byte{s.enc(fi.prefixRule(s.shard, s.part, p))}
	}
	// Keep the affinity ids of endpoints that stay.
	old := map[netip.AddrPort]uint32{}
	for i, ep := range s.prevSlots[which] {
		if i < len(s.prevAIDs[which]) {
			old[ep] = s.prevAIDs[which][i]
		}
	}
	aids := make([]uint32, len(slots))
	for i, ep := range slots {
		if aids[i] = old[ep]; aids[i] == 0 {
			aids[i] = s.a.newAID()
		}
	}
	s.o.aids[which] = aids
	s.o.uses(shardRef{kind: objAffinity, shard: s.shard})
	var out [][]byte
	for _, ru := range fi.affinityRules(s.shard, aids, slots, s.affinity) {
		out = append(out, s.enc(ru))
	}
	return out
}

// cluster balances cluster traffic over the internal endpoints: from the
// shard's cluster chain when the cluster IP's range set is free and
// there is no affinity, else from the service port's svc chain.
func (s *svcRender) cluster(name model.ServicePortName, internal []netip.AddrPort) {
	fi, sp := &s.fi, s.sp
	if len(internal) == 0 {
		if s.clusterKey != nil {
			s.add(setNoEndpointIPs, elem{Key: s.clusterKey, Verdict: &verdict{Code: nfDrop}})
		}
		return
	}
	slots := s.slotsOf(0, internal)
	var p []byte
	if s.clusterKey != nil && s.affinity == 0 {
		if tp, ok := fi.tuplePrefix(sp.ClusterIP, sp.Protocol, sp.Port); ok && s.free(tp) {
			p = tp
		}
	}
	if p != nil {
		s.clusterPrefix = p
		s.ranges(p, 0)
		s.add(setServiceIPs, elem{Key: s.clusterKey, Verdict: s.toShared(objCluster)})
		return
	}
	svc := svcChain(name)
	c := chainObj{name: svc}
	if s.masqCluster {
		c.enc = append(c.enc, s.jumpMasq)
	}
	c.enc = append(c.enc, s.ownGroup(0, slots)...)
	s.o.chains = append(s.o.chains, c)
	if s.clusterKey != nil {
		s.add(setServiceIPs, elem{Key: s.clusterKey, Verdict: goToV(svc)})
	}
}

// external balances the node port and the external and load-balancer
// addresses: over the external endpoints, and, for pods and the node
// reaching a service with policy Local, over the cluster-wide ones (wide,
// a group of its own when wideGroup; else the internal endpoints).
func (s *svcRender) external(name model.ServicePortName, internal, externalEps, wide []netip.AddrPort, wideGroup bool) {
	sp := s.sp
	drop := &verdict{Code: nfDrop}
	// Pods and the node itself reach a Local service's external addresses
	// through its cluster-wide endpoints (kube-proxy's "short-circuit"
	// rules), also when the node has no local endpoint.
	if !wideGroup {
		wide = internal
	}
	shortCircuit := sp.ExternalPolicy == model.PolicyLocal && len(wide) > 0
	if len(externalEps) == 0 {
		// What the external chain does not send on is dropped by the
		// filter chains' endpoint check, after DNAT.
		noEndpoints(s.add, nil, s.extKeys, s.npKey, drop)
		if !shortCircuit {
			return
		}
	}
	slots := s.slotsOf(1, externalEps)
	if sp.ExternalPolicy != model.PolicyLocal && s.affinity == 0 && s.externalShared() {
		return
	}
	ext := extChain(name)
	c := chainObj{name: ext}
	if sp.ExternalPolicy != model.PolicyLocal {
		c.enc = append(c.enc, s.mark)
		if len(internal) > 0 && model.SameAddrs(internal, externalEps) {
			c.enc = append(c.enc, s.toCluster(name, nil))
		} else {
			c.enc = append(c.enc, s.ownGroup(1, slots)...)
		}
	} else {
		if shortCircuit {
			c.enc = append(c.enc, s.shortCircuit(name, wide, wideGroup)...)
		}
		if len(externalEps) > 0 {
			c.enc = append(c.enc, s.ownGroup(1, slots)...)
		}
	}
	s.o.chains = append(s.o.chains, c)
	for _, k := range s.extKeys {
		s.add(setServiceIPs, elem{Key: k, Verdict: goToV(ext)})
	}
	if s.npKey != nil {
		s.add(setServiceNodePorts, elem{Key: s.npKey, Verdict: goToV(ext)})
	}
}

// externalShared balances external traffic with policy Cluster from the
// shard's shared chains, when every address's range set prefix is free;
// it reports whether it did.
func (s *svcRender) externalShared() bool {
	fi, sp := &s.fi, s.sp
	var prefixes [][]byte
	ok := true
	for _, a := range s.extAddrs {
		p, pok := fi.tuplePrefix(a, sp.Protocol, sp.Port)
		ok = ok && pok
		prefixes = append(prefixes, p)
	}
	var npPrefix []byte
	if s.npKey != nil {
		npPrefix = nodePortPrefix(sp.Protocol, sp.NodePort)
		prefixes = append(prefixes, npPrefix)
	}
	if !ok || !s.free(prefixes...) {
		return false
	}
	for i, k := range s.extKeys {
		s.ranges(prefixes[i], 1)
		s.add(setServiceIPs, elem{Key: k, Verdict: s.toShared(objExternal)})
	}
	if s.npKey != nil {
		s.ranges(npPrefix, 1)
		s.add(setServiceNodePorts, elem{Key: s.npKey, Verdict: s.toShared(objNodePort)})
	}
	return true
}

// toCluster ends a rule by balancing over the cluster endpoints.
func (s *svcRender) toCluster(name model.ServicePortName, ru rule) []byte {
	if s.clusterPrefix != nil {
		return s.enc(append(ru, s.fi.prefixRule(s.shard, s.part, s.clusterPrefix)...))
	}
	return s.enc(append(ru, nftnl.Goto(svcChain(name))))
}

// shortCircuit returns the external chain's rules that send pods and the
// node to the cluster-wide endpoints (kube-proxy's short circuit). With
// internalTrafficPolicy Local too (wideGroup), they have a group of their
// own, the cluster-wide endpoints (proxier.Targets.Cluster); with
// affinity, in a chain of its own.
func (s *svcRender) shortCircuit(name model.ServicePortName, wide []netip.AddrPort, wideGroup bool) [][]byte {
	fi := &s.fi
	toWide := func(ru rule) []byte { return s.toCluster(name, ru) }
	if wideGroup {
		ws := s.slotsOf(groupWide, wide)
		var pick rule
		if s.affinity == 0 {
			p := ownGroupPrefix(s.a.id, groupWide)
			s.ranges(p, groupWide)
			pick = fi.prefixRule(s.shard, s.part, p)
		} else {
			// Affinity takes several rules: a chain of its own.
			all := allChain(name)
			s.o.chains = append(s.o.chains, chainObj{name: all, enc: s.ownGroup(groupWide, ws)})
			pick = rule{nftnl.Goto(all)}
		}
		toWide = func(ru rule) []byte { return s.enc(append(ru, pick...)) }
	}
	// Pods keep their address; the node's own traffic is masqueraded
	// (its source would be the external address itself). masqueradeAll
	// does not apply: kube-proxy masquerades it by cluster IP destination
	// only.
	var out [][]byte
	if s.clusterCIDRs {
		out = append(out, toWide(rule{fi.LoadSaddr(nftnl.Reg(0)), nftnl.Lookup(setClusterCIDRs, nftnl.Reg(0), false)}))
	}
	return append(out, toWide(append(nftnl.FibLocal(true, expr.CmpOpEq), nftnl.SetMark(s.bit)...)))
}
