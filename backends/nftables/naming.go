package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// Names of the table's fixed chains. Per-service chains are named by
// svcChain and extChain.
const (
	chainFilterPrerouting = "filter-prerouting"
	chainFilterInput      = "filter-input"
	chainFilterForward    = "filter-forward"
	chainFilterOutput     = "filter-output"
	chainFilterOutputPost = "filter-output-post-dnat"
	chainNATPrerouting    = "nat-prerouting"
	chainNATOutput        = "nat-output"
	chainNATPostrouting   = "nat-postrouting"

	chainServices       = "services"
	chainEndpointsCheck = "endpoints-check"
	chainNodePortsCheck = "nodeport-endpoints-check"
	chainReject         = "reject-chain"
	chainMasqCluster    = "mark-cluster-masquerade"
)

// Names of the table's sets and maps. Their number is fixed: per-service
// state lives in elements, never in sets of its own.
const (
	setServiceIPs       = "service-ips"
	setServiceNodePorts = "service-nodeports"
	setNoEndpointIPs    = "no-endpoint-services"
	setNoEndpointPorts  = "no-endpoint-nodeports"
	setEndpointsPrefix  = "endpoints-" // + shard
	setAffinityPrefix   = "affinity-"  // + shard
	setFirewallIPs      = "firewall-ips"
	setFirewallAllow    = "firewall-allow"
	setClusterCIDRs     = "cluster-cidrs"
	setNodePortIPs      = "nodeport-ips"
	setHairpin          = "hairpin"
	setClusterIPs       = "cluster-ips"
	setServiceCIDRs     = "service-cidrs"
)

// Hook priorities of the base chains, relative to the kernel's NAT.
const (
	prioFilterPreDNAT  = -110 // dstnat - 10
	prioDNAT           = -100 // dstnat
	prioFilterPostDNAT = -90  // dstnat + 10
	prioSNAT           = 100  // srcnat
)

// svcChain names the chain that balances a service port's cluster traffic.
func svcChain(n model.ServicePortName) string { return "svc-" + chainSuffix(n) }

// extChain names the chain that handles a service port's external traffic
// (node port, external IPs, load-balancer IPs).
func extChain(n model.ServicePortName) string { return "ext-" + chainSuffix(n) }

// allChain names the chain that balances pods' and the node's traffic to
// the external addresses of a service port with both traffic policies
// Local over its cluster-wide endpoints, with session affinity (without,
// the external chain does it in one rule).
func allChain(n model.ServicePortName) string { return "all-" + chainSuffix(n) }

func chainSuffix(n model.ServicePortName) string {
	s := n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol))
	if n.Port != "" {
		s += "/" + n.Port
	}
	return s
}

// numShards is the number of endpoint maps, affinity sets and shared
// chains of each kind. The kernel rebuilds an interval map's lookup array
// from the whole map at every commit that changes it, and walks a map's
// elements when a rule binds it: shards keep both walks short while the
// number of sets stays constant.
const numShards = 256

// Shared chains, one per shard and kind, balance the service ports whose
// dispatch key (the packet's daddr . proto . dport, or proto . dport for
// node ports) identifies their endpoint group: see tupleRule.
const (
	chainClusterPrefix  = "cluster-"  // + shard: cluster IPs
	chainExternalPrefix = "external-" // + shard: external and load-balancer IPs, policy Cluster
	chainNodePortPrefix = "nodeport-" // + shard: node ports, policy Cluster
)

// numParts is the number of endpoint maps a shard may split into. The
// kernel rebuilds an interval map's lookup array from the whole map at
// every commit that changes it (nft_rbtree_commit, 6.18): one map per
// shard held about 8,500 elements at 100,000 service ports, and an
// endpoint change spent most of its kernel time there. But the kernel
// also finds a set by name by walking the table's list of sets, once per
// message (and 16 parts at 10,000 service ports made a change slower
// than one): the parts come into use only past defaultPartSpan service
// ports, and are few. The shard's shared chains read every part in use,
// one balancing rule each (a lookup that finds nothing ends its rule,
// and the packet goes on to the next), without adding chains, which
// every commit walks.
const numParts = 4

// defaultPartSpan is the number of consecutive service port ids whose
// range sets share a part of their shard's endpoint maps: up to 10,240
// service ports the table has one endpoint map per shard (~40 service
// ports each), as many as a change at 10,000 x 10 takes in about the
// time the kernel needs to find a set among 256; the next 10,240 go to
// part 1, and so on around the parts (see renderer.partOf).
const defaultPartSpan = 40 * numShards

// groupOf returns the shard of the service port with id id and the local
// number of its internal (ext 0) or external (ext 1) endpoint group, which
// names the group's ranges when it has a chain of its own. Both groups of a
// service port share a shard.
func groupOf(id, ext uint32) (shard, local uint32) {
	return id % numShards, id/numShards*2 + ext
}

// endpointsMap names part part of a shard's endpoint maps: endpoints-SHARD
// for part 0, endpoints-SHARD-PART for the others.
func endpointsMap(shard, part uint32) string {
	if part == 0 {
		return fmt.Sprintf("%s%03d", setEndpointsPrefix, shard)
	}
	return fmt.Sprintf("%s%03d-%d", setEndpointsPrefix, shard, part)
}

// shardOfMap returns the name of part 0 of the endpoint map set belongs
// to (set itself for part 0 and any other set): range set prefixes are
// unique within a shard, since its shared chains read all its parts.
func shardOfMap(set string) string {
	const n = len(setEndpointsPrefix) + 3
	if len(set) > n && set[n] == '-' && strings.HasPrefix(set, setEndpointsPrefix) {
		return set[:n]
	}
	return set
}

func affinitySet(shard uint32) string { return fmt.Sprintf("%s%03d", setAffinityPrefix, shard) }
func sharedChain(kind string, shard uint32) string {
	return fmt.Sprintf("%s%03d", kind, shard)
}

// familyInfo holds what differs between IPv4 and IPv6: internal/nftnl's
// family facts, plus the two the backend's files name most, under short
// names (fam is Family.IP, proto Family.Proto).
type familyInfo struct {
	nftnl.Family
	fam   model.IPFamily
	proto byte // NFPROTO_IPV4 or NFPROTO_IPV6
}

func familyInfoOf(f model.IPFamily) familyInfo {
	nf := nftnl.FamilyOf(f)
	return familyInfo{Family: nf, fam: nf.IP, proto: nf.Proto}
}

// Key encodings. Concatenated keys pad each field to 4 bytes. Ids and
// indexes are in host byte order (as numgen writes them); addresses, ports
// and protocols in network byte order.

// port is a port as a concatenation field (see nftnl.Port).
func port(p uint16) []byte { return nftnl.Port(p) }

// ipKey is the key of setServiceIPs, setNoEndpointIPs and setFirewallIPs:
// daddr . l4proto . dport.
func (fi *familyInfo) ipKey(a netip.Addr, p model.Protocol, pt uint16) []byte {
	return fi.Key(a, p, pt)
}

// Endpoint map keys. An endpoint map is an interval map (ordered by
// memcmp) from 16-byte keys, PREFIX . POSITION, to endpoints. The 12-byte
// prefix names a range set; a random position below randRange picks the
// endpoint whose range holds it. Prefixes:
//
//	IPv4 service address:  daddr . proto . dport (the packet's own)
//	IPv6 service address:  jhash(daddr . proto . dport) . 0 . 0
//	node port:             ff ff ff ff . proto . dport
//	a group with a chain:  ff ff ff fe . local group number . ff ff ff ff
//
// They cannot collide: 255.255.255.254 and .255 are never served from
// shared chains, the hash leaves its last eight bytes zero, the others do
// not.
const (
	prefixLen   = 12
	randRange   = 0xffff // numgen modulus: positions 0..65534
	hashModulus = 0xffffffff
	tagNodePort = 0xffffffff
	tagGroup    = 0xfffffffe
)

// hashSeed is the seed of the IPv6 address hash.
const hashSeed = 0x70726f78 // "prox"

// tuplePrefix returns the prefix of a service address (see above). ok is
// false for the two IPv4 addresses that could collide with a tag.
func (fi *familyInfo) tuplePrefix(a netip.Addr, p model.Protocol, pt uint16) (prefix []byte, ok bool) {
	k := fi.ipKey(a, p, pt)
	if fi.AddrLen == 4 {
		if v := binary.BigEndian.Uint32(k); v == tagNodePort || v == tagGroup {
			return nil, false
		}
		return k, true
	}
	h := nftnl.ReciprocalScale(nftnl.Jhash(k, hashSeed), hashModulus)
	return append(binary.NativeEndian.AppendUint32(nil, h), make([]byte, 8)...), true
}

// nodePortPrefix returns the prefix of a node port.
func nodePortPrefix(p model.Protocol, pt uint16) []byte {
	return append(nftnl.BE32(tagNodePort), nftnl.PortKey(p, pt)...)
}

// groupPrefix returns the prefix of a group with a chain of its own.
func groupPrefix(local uint32) []byte {
	return slices.Concat(nftnl.BE32(tagGroup), nftnl.U32(local), nftnl.BE32(0xffffffff))
}

// Endpoint groups of a service port.
const (
	groupInternal = 0
	groupExternal = 1
	// groupWide is the cluster-wide group of a service port with both
	// traffic policies Local (proxier.Targets.Cluster).
	groupWide = 2
	numGroups = 3
)

// ownGroupPrefix returns the range set prefix of group which of the
// service port with id id, when the group has a chain of its own. The
// cluster-wide group shares the internal group's number and differs in
// the last word.
func ownGroupPrefix(id, which uint32) []byte {
	if which == groupWide {
		_, local := groupOf(id, groupInternal)
		return slices.Concat(nftnl.BE32(tagGroup), nftnl.U32(local), nftnl.BE32(0xfffffffe))
	}
	_, local := groupOf(id, which)
	return groupPrefix(local)
}

// positionKey returns the last four bytes of a key at position pos: the
// bytes numgen writes (a host-order u32 below randRange) in memcmp order.
func positionKey(pos uint32) []byte {
	if nativeLittle {
		return []byte{byte(pos >> 8), byte(pos), 0, 0}
	}
	return []byte{0, 0, byte(pos >> 8), byte(pos)}
}

var nativeLittle = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// rangeStarts returns where the ranges of n endpoints start, and, last,
// where the last one ends: endpoint i owns the positions [starts[i],
// starts[i+1]). Ranges differ in size by at most one position.
func rangeStarts(n int) []uint32 {
	out := make([]uint32, n+1)
	for i := range out {
		out[i] = uint32(uint64(i) * randRange / uint64(n))
	}
	return out
}

// fixedSetSpecs returns the sets and maps the fixed chains use: every
// table has them.
func (fi *familyInfo) fixedSetSpecs() []*nftnl.Set {
	addr := fi.AddrType
	ipKey := nftnl.Concat(addr, nftnl.TypeInetProto, nftnl.TypeInetService)
	portKeyT := nftnl.Concat(nftnl.TypeInetProto, nftnl.TypeInetService)
	fwAllow := nftnl.Concat(addr, nftnl.TypeInetProto, nftnl.TypeInetService, addr)
	pair := nftnl.Concat(addr, addr)
	verdictMap := func(name string, key nftnl.Datatype, comment string) *nftnl.Set {
		return &nftnl.Set{Name: name, Key: key, Data: nftnl.TypeVerdict, Comment: comment}
	}
	specs := []*nftnl.Set{
		verdictMap(setServiceIPs, ipKey, "cluster, external and load-balancer IPs: daddr . proto . port -> service chain"),
		verdictMap(setServiceNodePorts, portKeyT, "node ports: proto . port -> external chain"),
		verdictMap(setNoEndpointIPs, ipKey, "service addresses without usable endpoints -> reject or drop"),
		verdictMap(setNoEndpointPorts, portKeyT, "node ports without usable endpoints -> reject or drop"),
		{Name: setFirewallIPs, Key: ipKey, Comment: "load-balancer IPs with source ranges"},
		{Name: setFirewallAllow, Key: fwAllow, Interval: true, Comment: "allowed sources of load-balancer IPs"},
		{Name: setClusterCIDRs, Key: addr, Interval: true, Comment: "pod networks"},
		{Name: setNodePortIPs, Key: addr, Interval: true, Comment: "node addresses node ports open on"},
		{Name: setHairpin, Key: pair, Comment: "endpoint . endpoint: a pod reaching itself through a service"},
		{Name: setClusterIPs, Key: addr, Comment: "cluster IPs; other ports on them are rejected"},
		{Name: setServiceCIDRs, Key: addr, Interval: true, Comment: "service CIDRs; unallocated addresses in them are dropped"},
	}
	for i, s := range specs {
		s.ID = uint32(i + 1)
	}
	return specs
}

// endpointsMapSpec returns part part of a shard's endpoint maps. Its keys
// are range set prefix . position (16 bytes, typed as IPv6 addresses for
// nft).
func (fi *familyInfo) endpointsMapSpec(shard, part uint32) *nftnl.Set {
	id := firstShardSetID + 2*shard
	if part > 0 {
		id = firstShardSetID + 2*numShards + shard*numParts + part
	}
	return &nftnl.Set{Name: endpointsMap(shard, part), ID: id,
		Key: nftnl.TypeIP6Addr, Data: nftnl.Concat(fi.AddrType, nftnl.TypeInetService), Interval: true,
		Comment: "range set prefix . random position -> endpoint"}
}

// affinitySetSpec returns the affinity set of a shard, which holds at
// most size clients.
func (fi *familyInfo) affinitySetSpec(shard, size uint32) *nftnl.Set {
	return &nftnl.Set{Name: affinitySet(shard), ID: firstShardSetID + 2*shard + 1,
		Key: nftnl.Concat(nftnl.TypeMark, fi.AddrType), Timeout: true, Dynamic: true, Size: size,
		Comment: "session affinity: endpoint id . client"}
}

// firstShardSetID is the transaction-local id of the first shard set;
// the fixed sets have the ids below it.
const firstShardSetID = 64
