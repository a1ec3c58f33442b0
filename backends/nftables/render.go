package nftables

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
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
	for i, ep := range slots {
		out, buf = appendRangeBuf(out, buf, r, starts, i, ep)
	}
	return out
}

// appendRange appends the elements of range i of range set r, whose
// ranges start at starts, with endpoint ep: its start (with ep as data)
// and its end.
func appendRange(out []elem, r *rangeSpec, starts []uint32, i int, ep netip.AddrPort) []elem {
	out, _ = appendRangeBuf(out, make([]byte, 0, 2*(prefixLen+4+20)), r, starts, i, ep)
	return out
}

// appendRangeBuf is appendRange writing keys and values into buf, which
// it returns grown.
func appendRangeBuf(out []elem, buf []byte, r *rangeSpec, starts []uint32, i int, ep netip.AddrPort) ([]elem, []byte) {
	put := func(parts ...[]byte) []byte {
		start := len(buf)
		for _, p := range parts {
			buf = append(buf, p...)
		}
		return buf[start:len(buf):len(buf)]
	}
	a := ep.Addr().AsSlice()
	out = append(out,
		elem{Key: put(r.prefix, positionKey(starts[i])), Val: put(a, port(ep.Port()))},
		elem{Key: put(r.prefix, positionKey(starts[i+1])), IntervalEnd: true})
	return out, buf
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
	// partSpan is the number of consecutive service port ids that share
	// a part of their shard's endpoint maps (defaultPartSpan; tests make
	// it smaller).
	partSpan uint32

	// Encoded constant rules.
	jumpMasq, mark []byte
	// objects caches the shard objects built so far.
	objects map[objectKey]*shardObject
}

func newRenderer(fi familyInfo, bit, affinitySize uint32, masqAll, clusterCIDRs bool, nodeIP netip.Addr) (*renderer, error) {
	r := &renderer{fi: fi, bit: bit, masqCluster: masqAll || clusterCIDRs, clusterCIDRs: clusterCIDRs, masqAll: masqAll,
		nodeIP: nodeIP, affinitySize: affinitySize, partSpan: defaultPartSpan}
	var err error
	if r.jumpMasq, err = encodeExprs(fi.proto, rule{nftnl.Jump(chainMasqCluster)}); err != nil {
		return nil, err
	}
	if r.mark, err = encodeExprs(fi.proto, nftnl.SetMark(bit)); err != nil {
		return nil, err
	}
	return r, nil
}

// partOf returns the part of its shard's endpoint maps that holds the
// range sets of the service port with id id: consecutive ids, partSpan
// at a time, fill the parts in turn.
func (r *renderer) partOf(id uint32) uint32 { return id / r.partSpan % numParts }

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

// sameList reports whether a and b are the same non-empty list (not only
// equal ones): the engine gives a service port of policy Cluster one list
// for internal and external traffic.
func sameList(a, b []*model.Endpoint) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// endpoints returns the distinct usable endpoint addresses of eps.
func (r *renderer) endpoints(eps []*model.Endpoint) []netip.AddrPort {
	return model.DistinctAddrs(eps, r.fi.fam.Usable)
}

// stableSlots orders eps so that endpoints keep the index they had in prev:
// new endpoints take the indexes of removed ones first (in order), then
// are appended; an index still free goes to the last endpoint. Replacing
// one endpoint thus changes one index, and adding or removing one at most
// two. Without prev, the result is eps itself: the caller's, never
// modified.
func stableSlots(prev, eps []netip.AddrPort) []netip.AddrPort {
	if len(prev) == 0 {
		return eps
	}
	// eps are distinct: one map from the previous slots does.
	at := make(map[netip.AddrPort]int, len(prev))
	for i, p := range prev {
		at[p] = i
	}
	slots := make([]netip.AddrPort, len(prev), max(len(prev), len(eps)))
	var added []netip.AddrPort
	for _, e := range eps {
		if i, ok := at[e]; ok {
			slots[i] = e
		} else {
			added = append(added, e)
		}
	}
	for i := range slots {
		if len(added) == 0 {
			break
		}
		if !slots[i].IsValid() {
			slots[i], added = added[0], added[1:]
		}
	}
	slots = append(slots, added...)
	// Fill the holes left from the end.
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
