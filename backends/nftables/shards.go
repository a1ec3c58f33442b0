package nftables

import (
	"cmp"
	"slices"

	"github.com/proxykit/proxykit/internal/nftnl"
)

// This file names a shard's objects (its endpoint map, affinity set and
// shared chains) and builds them. A table holds the objects of the shards
// its service ports use, and no others: a node with six services lists a
// few chains and maps, not all 256 shards'. At scale every shard is in use
// and the table is what it would be with all of them built up front.

// shardObjKind is a kind of shard object. Sets sort before chains: a
// transaction creates them first and deletes them last.
type shardObjKind uint8

const (
	objEndpoints shardObjKind = iota // endpoint map (a set)
	objAffinity                      // affinity set
	objCluster                       // shared chain: cluster IPs
	objExternal                      // shared chain: external and load-balancer IPs, policy Cluster
	objNodePort                      // shared chain: node ports, policy Cluster
)

// shardRef names one object of one shard: part is the part of an
// endpoint map (see numParts), 0 for the other kinds.
type shardRef struct {
	kind  shardObjKind
	shard uint32
	part  uint32
}

// isSet reports whether the object is a set (else a chain).
func (r shardRef) isSet() bool { return r.kind <= objAffinity }

// name returns the object's name in the table.
func (r shardRef) name() string {
	switch r.kind {
	case objEndpoints:
		return endpointsMap(r.shard, r.part)
	case objAffinity:
		return affinitySet(r.shard)
	case objCluster:
		return sharedChain(chainClusterPrefix, r.shard)
	case objExternal:
		return sharedChain(chainExternalPrefix, r.shard)
	}
	return sharedChain(chainNodePortPrefix, r.shard)
}

// compareRefs orders refs for creation: sets before chains.
func compareRefs(a, b shardRef) int {
	if c := cmp.Compare(a.kind, b.kind); c != 0 {
		return c
	}
	if c := cmp.Compare(a.shard, b.shard); c != 0 {
		return c
	}
	return cmp.Compare(a.part, b.part)
}

// uses records that o refers to ref (once).
func (o *svcObjs) uses(ref shardRef) {
	if !slices.Contains(o.refs, ref) {
		o.refs = append(o.refs, ref)
	}
}

// shardObject is a shard object ready for a transaction: a set, or a
// chain with its encoded rules.
type shardObject struct {
	set   *nftnl.Set
	chain *chainObj
}

// partSet is a set of parts of a shard's endpoint maps: bit p for part p.
type partSet uint16

// partsOf returns the parts of shard's endpoint maps that n, a count of
// users, says are in use.
func partsOf(shard uint32, n func(shardRef) int) partSet {
	var ps partSet
	for p := range uint32(numParts) {
		if n(shardRef{kind: objEndpoints, shard: shard, part: p}) > 0 {
			ps |= 1 << p
		}
	}
	return ps
}

// objectKey identifies a built shard object: a shared chain's rules
// depend on the parts of its shard's endpoint maps in use.
type objectKey struct {
	ref   shardRef
	parts partSet
}

// object returns the shard object ref, built once per renderer; a shared
// chain reads the endpoint map parts parts (ignored for sets).
func (r *renderer) object(ref shardRef, parts partSet) (*shardObject, error) {
	if ref.isSet() {
		parts = 0
	}
	key := objectKey{ref, parts}
	if o := r.objects[key]; o != nil {
		return o, nil
	}
	fi := &r.fi
	o := &shardObject{}
	switch ref.kind {
	case objEndpoints:
		o.set = fi.endpointsMapSpec(ref.shard, ref.part)
	case objAffinity:
		o.set = fi.affinitySetSpec(ref.shard, r.affinitySize)
	default:
		c := &chainObj{name: ref.name(), rules: fi.sharedChainRules(ref, parts, r.bit, r.masqCluster)}
		if err := r.encode(c); err != nil {
			return nil, err
		}
		o.chain = c
	}
	if r.objects == nil {
		r.objects = map[objectKey]*shardObject{}
	}
	r.objects[key] = o
	return o, nil
}

// objectCounts counts the service ports that use each shard object.
type objectCounts map[shardRef]int

// add adds d to the counts of the objects o uses.
func (c objectCounts) add(o *svcObjs, d int) {
	for _, ref := range o.refs {
		if n := c[ref] + d; n != 0 {
			c[ref] = n
		} else {
			delete(c, ref)
		}
	}
}

// parts returns the parts of shard's endpoint maps in use.
func (c objectCounts) parts(shard uint32) partSet {
	return partsOf(shard, func(ref shardRef) int { return c[ref] })
}

// sorted returns the objects with a positive count, in creation order.
func (c objectCounts) sorted() []shardRef {
	out := make([]shardRef, 0, len(c))
	for ref, n := range c {
		if n > 0 {
			out = append(out, ref)
		}
	}
	slices.SortFunc(out, compareRefs)
	return out
}
