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

// This file renders desired state into kernel objects: the chains, rules
// and set elements of one service port. Rendering is pure: it reads the
// service, its targets and the previous rendering (to keep endpoint
// indexes stable) and touches nothing.

// maxChainName is NFT_NAME_MAXLEN less the terminating NUL.
const maxChainName = 255

// chainObj is a chain and its rules.
type chainObj struct {
	name  string
	hook  *nftnl.Hook // nil for a regular chain
	rules []rule      // as built
	enc   [][]byte
}

// setElem is an element of a named set.
type setElem struct {
	set string
	e   elem
}

// id returns the element's identity within its set.
func (s *setElem) id() string {
	id := string(s.e.Key) + "|" + string(s.e.KeyEnd)
	if s.e.IntervalEnd {
		id += "|end"
	}
	return id
}

// sameData reports whether two elements with the same key carry the same
// data.
func (s *setElem) sameData(o *setElem) bool {
	if !bytes.Equal(s.e.Val, o.e.Val) || s.e.Timeout != o.e.Timeout {
		return false
	}
	if (s.e.Verdict == nil) != (o.e.Verdict == nil) {
		return false
	}
	return s.e.Verdict == nil || *s.e.Verdict == *o.e.Verdict
}

// refcounted sets hold elements several service ports may share; an
// element stays while one of them needs it.
func refcounted(set string) bool { return set == setHairpin || set == setClusterIPs }

// svcObjs is the rendering of one service port. Its endpoint range and
// hairpin elements are kept as what they derive from (slots and ranges),
// a third of the memory of the elements themselves; elements() spells
// them out.
type svcObjs struct {
	chains []chainObj
	// fixed are the elements other than ranges and hairpin ones.
	fixed []setElem
	// ranges are the range sets of the endpoint groups.
	ranges []rangeSpec
	// slots are the endpoints of the internal, external and cluster-wide
	// (short-circuit, see proxier.Targets.Cluster) groups, in range
	// order; aids their affinity ids (with session affinity only).
	slots [numGroups][]netip.AddrPort
	aids  [numGroups][]uint32
	// refs are the shard objects (endpoint map, affinity set, shared
	// chains) the elements and chains refer to.
	refs []shardRef
}

// rangeSpec is the range set of an endpoint group: the endpoints of
// slots[group] under prefix in an endpoint map.
type rangeSpec struct {
	set    string
	prefix []byte
	group  uint8
}

// ownElems returns o's elements of sets that are not refcounted (see
// eachRef for the others): the fixed ones and the ranges.
func (o *svcObjs) ownElems() []setElem {
	n := len(o.fixed)
	for _, r := range o.ranges {
		n += 2 * len(o.slots[r.group])
	}
	out := make([]setElem, 0, n)
	for _, e := range o.fixed {
		if !refcounted(e.set) {
			out = append(out, e)
		}
	}
	for i := range o.ranges {
		r := &o.ranges[i]
		for _, e := range appendRanges(nil, r, o.slots[r.group]) {
			out = append(out, setElem{set: r.set, e: e})
		}
	}
	return out
}

// appendRanges appends the elements of range set r over slots, in key
// order: for each endpoint, the start of its range (with the endpoint as
// data) and its end.
func appendRanges(out []elem, r *rangeSpec, slots []netip.AddrPort) []elem {
	starts := rangeStarts(len(slots))
	// One allocation for all keys and values.
	buf := make([]byte, 0, len(slots)*2*(prefixLen+4+20))
	put := func(parts ...[]byte) []byte {
		start := len(buf)
		for _, p := range parts {
			buf = append(buf, p...)
		}
		return buf[start:len(buf):len(buf)]
	}
	for i, ep := range slots {
		a := ep.Addr().AsSlice()
		out = append(out,
			elem{Key: put(r.prefix, positionKey(starts[i])), Val: put(a, port(ep.Port()))},
			elem{Key: put(r.prefix, positionKey(starts[i+1])), IntervalEnd: true})
	}
	return out
}

// renderer renders service ports for one family and configuration.
type renderer struct {
	fi           familyInfo
	bit          uint32
	masqCluster  bool // chainMasqCluster exists
	clusterCIDRs bool

	masqAll bool
	// nodeIP is the node's primary address of the family, if known.
	nodeIP netip.Addr

	// affinitySize is the size of the affinity sets.
	affinitySize uint32

	// Encoded constant rules.
	jumpMasq, mark []byte
	// objects caches the shard objects built so far.
	objects map[shardRef]*shardObject
}

func newRenderer(fi familyInfo, bit, affinitySize uint32, masqAll, clusterCIDRs bool, nodeIP netip.Addr) (*renderer, error) {
	r := &renderer{fi: fi, bit: bit, masqCluster: masqAll || clusterCIDRs, clusterCIDRs: clusterCIDRs, masqAll: masqAll,
		nodeIP: nodeIP, affinitySize: affinitySize}
	var err error
	if r.jumpMasq, err = encodeExprs(fi.proto, rule{nftnl.Jump(chainMasqCluster)}); err != nil {
		return nil, err
	}
	if r.mark, err = encodeExprs(fi.proto, nftnl.SetMark(bit)); err != nil {
		return nil, err
	}
	return r, nil
}

// encode encodes the rules of c.
func (r *renderer) encode(c *chainObj) error {
	c.enc = make([][]byte, len(c.rules))
	for i, ru := range c.rules {
		b, err := encodeExprs(r.fi.proto, ru)
		if err != nil {
			return fmt.Errorf("chain %s: %w", c.name, err)
		}
		c.enc[i] = b
	}
	return nil
}

// prefixTaken reports whether another service port's range set has the
// given prefix in set (see state.claim).
type prefixTaken func(set string, prefix []byte) bool

// service renders one service port with id id. prev is its previous
// rendering, or nil. newAID allocates affinity ids; taken says which range
// set prefixes other service ports hold.
//
// A group of endpoints is balanced from a shared chain when the packet's
// destination names its range set (see tupleRule): cluster traffic, and
// external traffic with policy Cluster, without session affinity. Other
// groups get a chain of their own (svc-… for cluster traffic, ext-… for
// external traffic).
func (r *renderer) service(name model.ServicePortName, sp *model.ServicePort, t *proxier.Targets, id uint32, prev *svcObjs, newAID func() uint32, taken prefixTaken) (*svcObjs, error) {
	fi := &r.fi
	if !sp.Protocol.Valid() {
		return nil, fmt.Errorf("unsupported protocol %q", sp.Protocol)
	}
	if len(svcChain(name)) > maxChainName {
		return nil, errors.New("name too long for an nftables chain")
	}
	if t == nil {
		t = &proxier.Targets{}
	}
	o := &svcObjs{}
	add := func(set string, e elem) { o.fixed = append(o.fixed, setElem{set: set, e: e}) }

	var clusterKey []byte
	if sp.ClusterIP.IsValid() {
		if !fi.fam.Contains(sp.ClusterIP) {
			return nil, fmt.Errorf("cluster IP %s is not %s", sp.ClusterIP, fi.fam)
		}
		if sp.Port == 0 {
			return nil, errors.New("port 0")
		}
		clusterKey = fi.ipKey(sp.ClusterIP, sp.Protocol, sp.Port)
		add(setClusterIPs, elem{Key: fi.Addr(sp.ClusterIP)})
	}
	var extAddrs []netip.Addr
	var extKeys, lbKeys [][]byte
	for i, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if !fi.fam.Contains(a) {
			return nil, fmt.Errorf("address %s is not %s", a, fi.fam)
		}
		if sp.Port == 0 {
			return nil, errors.New("port 0")
		}
		k := fi.ipKey(a, sp.Protocol, sp.Port)
		if slices.ContainsFunc(extKeys, func(o []byte) bool { return bytes.Equal(o, k) }) {
			continue
		}
		extKeys = append(extKeys, k)
		extAddrs = append(extAddrs, a)
		if i >= len(sp.ExternalIPs) {
			lbKeys = append(lbKeys, k)
		}
	}
	var npKey []byte
	if sp.NodePort != 0 {
		npKey = nftnl.PortKey(sp.Protocol, sp.NodePort)
	}

	// Firewall: source ranges of load-balancer IPs, whatever the endpoints.
	if ranges := normalizeRanges(fi.fam, sp.LoadBalancerSourceRanges); len(sp.LoadBalancerSourceRanges) > 0 {
		if sp.SourceRangesHold(r.nodeIP) {
			for _, a := range sp.LoadBalancerIPs {
				if fi.fam.Contains(a) {
					ranges = append(ranges, [2]netip.Addr{a.Unmap(), a.Unmap()})
				}
			}
		}
		for _, k := range lbKeys {
			add(setFirewallIPs, elem{Key: k})
			for _, rg := range ranges {
				add(setFirewallAllow, elem{Key: concat(k, fi.Addr(rg[0])), KeyEnd: concat(k, fi.Addr(rg[1]))})
			}
		}
	}

	external := sp.ExternallyAccessible()
	if !t.HasEndpoints {
		reject := &verdict{Code: unix.NFT_GOTO, Chain: chainReject}
		noEndpoints(add, clusterKey, extKeys, npKey, reject)
		return o, nil
	}
	drop := &verdict{Code: nfDrop}
	internal := r.endpoints(t.Internal)
	externalEps := r.endpoints(t.External)
	for _, eps := range [][]netip.AddrPort{internal, externalEps} {
		if len(eps) > randRange {
			return nil, fmt.Errorf("%d endpoints, more than %d", len(eps), randRange)
		}
	}

	svc, ext, all := svcChain(name), extChain(name), allChain(name)
	shard, _ := groupOf(id, 0)
	epMap := endpointsMap(shard)
	var prevSlots [numGroups][]netip.AddrPort
	var prevAIDs [numGroups][]uint32
	if prev != nil {
		prevSlots, prevAIDs = prev.slots, prev.aids
	}
	affinity := time.Duration(0)
	if sp.SessionAffinity {
		affinity = sp.AffinityTimeout.Truncate(time.Second)
		if affinity <= 0 {
			affinity = model.DefaultAffinityTimeout
		}
	}
	var encErr error
	enc := func(ru rule) []byte {
		b, err := encodeExprs(fi.proto, ru)
		if err != nil && encErr == nil {
			encErr = err
		}
		return b
	}
	goToV := func(chain string) *verdict { return &verdict{Code: unix.NFT_GOTO, Chain: chain} }

	// Range set prefixes this service port uses; a prefix another
	// service port (or this one, twice: an IPv6 hash collision) holds
	// makes the group use a chain of its own.
	used := map[string]bool{}
	free := func(prefixes ...[]byte) bool {
		seen := map[string]bool{}
		for _, p := range prefixes {
			if p == nil || used[string(p)] || seen[string(p)] || taken(epMap, p) {
				return false
			}
			seen[string(p)] = true
		}
		return true
	}
	ranges := func(prefix []byte, which uint32) {
		used[string(prefix)] = true
		o.ranges = append(o.ranges, rangeSpec{set: epMap, prefix: prefix, group: uint8(which)})
		o.uses(shardRef{objEndpoints, shard})
	}
	// toShared is a verdict to the shard's shared chain of a kind.
	toShared := func(kind shardObjKind) *verdict {
		ref := shardRef{kind, shard}
		o.uses(ref)
		return goToV(ref.name())
	}
	slotsOf := func(which uint32, eps []netip.AddrPort) []netip.AddrPort {
		slots := stableSlots(prevSlots[which], eps)
		o.slots[which] = slots
		return slots
	}
	// ownGroup balances a group from a chain of its own: its rules.
	ownGroup := func(which uint32, slots []netip.AddrPort) [][]byte {
		if affinity == 0 {
			p := ownGroupPrefix(id, which)
			ranges(p, which)
			return [][]byte{enc(fi.prefixRule(shard, p))}
		}
		// Keep the affinity ids of endpoints that stay.
		old := map[netip.AddrPort]uint32{}
		for i, ep := range prevSlots[which] {
			if i < len(prevAIDs[which]) {
				old[ep] = prevAIDs[which][i]
			}
		}
		aids := make([]uint32, len(slots))
		for i, ep := range slots {
			if aids[i] = old[ep]; aids[i] == 0 {
				aids[i] = newAID()
			}
		}
		o.aids[which] = aids
		o.uses(shardRef{objAffinity, shard})
		var out [][]byte
		for _, ru := range fi.affinityRules(shard, aids, slots, affinity) {
			out = append(out, enc(ru))
		}
		return out
	}

	// Cluster traffic.
	var clusterPrefix []byte // the internal group's prefix, when shared
	if len(internal) > 0 {
		slots := slotsOf(0, internal)
		var p []byte
		if clusterKey != nil && affinity == 0 {
			if tp, ok := fi.tuplePrefix(sp.ClusterIP, sp.Protocol, sp.Port); ok && free(tp) {
				p = tp
			}
		}
		if p != nil {
			clusterPrefix = p
			ranges(p, 0)
			add(setServiceIPs, elem{Key: clusterKey, Verdict: toShared(objCluster)})
		} else {
			c := chainObj{name: svc}
			if r.masqCluster {
				c.enc = append(c.enc, r.jumpMasq)
			}
			c.enc = append(c.enc, ownGroup(0, slots)...)
			o.chains = append(o.chains, c)
			if clusterKey != nil {
				add(setServiceIPs, elem{Key: clusterKey, Verdict: goToV(svc)})
			}
		}
	} else if clusterKey != nil {
		add(setNoEndpointIPs, elem{Key: clusterKey, Verdict: drop})
	}

	if !external {
		return o, encErr
	}
	// Pods and the node itself reach a Local service's external addresses
	// through its cluster-wide endpoints (kube-proxy's "short-circuit"
	// rules), also when the node has no local endpoint.
	// With internalTrafficPolicy Local too, they have a group of their
	// own, the cluster-wide endpoints (proxier.Targets.Cluster).
	wide, wideGroup := internal, t.Cluster != nil
	if wideGroup {
		wide = r.endpoints(t.Cluster)
	}
	shortCircuit := sp.ExternalPolicy == model.PolicyLocal && len(wide) > 0
	if len(externalEps) == 0 {
		// What the external chain does not send on is dropped by the
		// filter chains' endpoint check, after DNAT.
		noEndpoints(add, nil, extKeys, npKey, drop)
		if !shortCircuit {
			return o, encErr
		}
	}
	slots := slotsOf(1, externalEps)

	// External traffic, policy Cluster, from the shared chains when every
	// address's range set prefix is free.
	if sp.ExternalPolicy != model.PolicyLocal && affinity == 0 {
		var prefixes [][]byte
		ok := true
		for _, a := range extAddrs {
			p, pok := fi.tuplePrefix(a, sp.Protocol, sp.Port)
			ok = ok && pok
			prefixes = append(prefixes, p)
		}
		var npPrefix []byte
		if npKey != nil {
			npPrefix = nodePortPrefix(sp.Protocol, sp.NodePort)
			prefixes = append(prefixes, npPrefix)
		}
		if ok && free(prefixes...) {
			for i, k := range extKeys {
				ranges(prefixes[i], 1)
				add(setServiceIPs, elem{Key: k, Verdict: toShared(objExternal)})
			}
			if npKey != nil {
				ranges(npPrefix, 1)
				add(setServiceNodePorts, elem{Key: npKey, Verdict: toShared(objNodePort)})
			}
			return o, encErr
		}
	}

	c := chainObj{name: ext}
	// toCluster ends a rule by balancing over the cluster endpoints.
	toCluster := func(ru rule) []byte {
		if clusterPrefix != nil {
			return enc(append(ru, fi.prefixRule(shard, clusterPrefix)...))
		}
		return enc(append(ru, nftnl.Goto(svc)))
	}
	if sp.ExternalPolicy != model.PolicyLocal {
		c.enc = append(c.enc, r.mark)
		if len(internal) > 0 && model.SameAddrs(internal, externalEps) {
			c.enc = append(c.enc, toCluster(nil))
		} else {
			c.enc = append(c.enc, ownGroup(1, slots)...)
		}
	} else {
		if shortCircuit {
			toWide := toCluster
			if wideGroup {
				ws := slotsOf(groupWide, wide)
				var pick rule
				if affinity == 0 {
					p := ownGroupPrefix(id, groupWide)
					ranges(p, groupWide)
					pick = fi.prefixRule(shard, p)
				} else {
					// Affinity takes several rules: a chain of its own.
					o.chains = append(o.chains, chainObj{name: all, enc: ownGroup(groupWide, ws)})
					pick = rule{nftnl.Goto(all)}
				}
				toWide = func(ru rule) []byte { return enc(append(ru, pick...)) }
			}
			// Pods keep their address; the node's own traffic is
			// masqueraded (its source would be the external address
			// itself). masqueradeAll does not apply: kube-proxy
			// masquerades it by cluster IP destination only.
			if r.clusterCIDRs {
				c.enc = append(c.enc, toWide(rule{fi.LoadSaddr(nftnl.Reg(0)), nftnl.Lookup(setClusterCIDRs, nftnl.Reg(0), false)}))
			}
			c.enc = append(c.enc, toWide(append(nftnl.FibLocal(true, expr.CmpOpEq), nftnl.SetMark(r.bit)...)))
		}
		if len(externalEps) > 0 {
			c.enc = append(c.enc, ownGroup(1, slots)...)
		}
	}
	o.chains = append(o.chains, c)
	for _, k := range extKeys {
		add(setServiceIPs, elem{Key: k, Verdict: goToV(ext)})
	}
	if npKey != nil {
		add(setServiceNodePorts, elem{Key: npKey, Verdict: goToV(ext)})
	}
	return o, encErr
}

func noEndpoints(add func(string, elem), clusterKey []byte, extKeys [][]byte, npKey []byte, v *verdict) {
	if clusterKey != nil {
		add(setNoEndpointIPs, elem{Key: clusterKey, Verdict: v})
	}
	for _, k := range extKeys {
		add(setNoEndpointIPs, elem{Key: k, Verdict: v})
	}
	if npKey != nil {
		add(setNoEndpointPorts, elem{Key: npKey, Verdict: v})
	}
}

// endpoints returns the distinct usable endpoint addresses of eps.
func (r *renderer) endpoints(eps []*model.Endpoint) []netip.AddrPort {
	return model.DistinctAddrs(eps, r.fi.fam.Usable)
}

// stableSlots orders eps so that endpoints keep the index they had in prev:
// a removed endpoint's index goes to the last one, new endpoints are
// appended. A one-endpoint change thus touches at most two indexes.
func stableSlots(prev, eps []netip.AddrPort) []netip.AddrPort {
	if len(prev) == 0 {
		return slices.Clone(eps)
	}
	want := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		want[e] = true
	}
	slots := make([]netip.AddrPort, 0, len(eps))
	seen := make(map[netip.AddrPort]bool, len(eps))
	for _, p := range prev {
		if want[p] {
			slots = append(slots, p)
			seen[p] = true
		} else {
			slots = append(slots, netip.AddrPort{}) // hole
		}
	}
	// Fill holes from the end.
	for i := 0; i < len(slots); i++ {
		if slots[i].IsValid() {
			continue
		}
		for len(slots) > i+1 && !slots[len(slots)-1].IsValid() {
			slots = slots[:len(slots)-1]
		}
		if len(slots) > i+1 {
			slots[i] = slots[len(slots)-1]
		}
		slots = slots[:len(slots)-1]
		i--
	}
	for _, e := range eps {
		if !seen[e] {
			slots = append(slots, e)
		}
	}
	return slots
}

// normalizeRanges turns prefixes of family f into sorted, disjoint,
// inclusive address ranges, merging overlapping and adjacent ones.
func normalizeRanges(f model.IPFamily, prefixes []netip.Prefix) [][2]netip.Addr {
	var ps []netip.Prefix
	for _, p := range prefixes {
		if p.IsValid() && f.Contains(p.Addr()) {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-bitsDelta(p)).Masked()
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	var out [][2]netip.Addr
	for _, p := range ps {
		start, end := p.Addr(), lastAddr(p)
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last[1].Next(); start.Compare(last[1]) <= 0 || (next.IsValid() && next == start) {
				if end.Compare(last[1]) > 0 {
					last[1] = end
				}
				continue
			}
		}
		out = append(out, [2]netip.Addr{start, end})
	}
	return out
}

// bitsDelta is 96 for an IPv4-mapped IPv6 prefix, else 0.
func bitsDelta(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// lastAddr returns the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// intervalElems encodes ranges as the elements of a single-field interval
// set: a start element and, unless the range reaches the end of the
// address space, an interval-end element at the address after it.
func (fi *familyInfo) intervalElems(ranges [][2]netip.Addr) []elem {
	var out []elem
	for _, rg := range ranges {
		out = append(out, elem{Key: fi.Addr(rg[0])})
		if next := rg[1].Next(); next.IsValid() {
			out = append(out, elem{Key: fi.Addr(next), IntervalEnd: true})
		}
	}
	return out
}

func concat(parts ...[]byte) []byte { return slices.Concat(parts...) }
