package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

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
	chainReject         = "reject"
	chainMasqCluster    = "mark-cluster-masquerade"
)

// Names of the table's sets and maps. Their number is fixed: per-service
// state lives in elements, never in sets of its own.
const (
	setServiceIPs        = "service-ips"
	setServiceNodePorts  = "service-nodeports"
	setNoEndpointIPs     = "no-endpoint-services"
	setNoEndpointPorts   = "no-endpoint-nodeports"
	setEndpointsPrefix   = "endpoints-" // + shard
	setAffinityPrefix    = "affinity-"  // + shard
	setAffinityEndpoints = "affinity-endpoints"
	setFirewallIPs       = "firewall-ips"
	setFirewallAllow     = "firewall-allow"
	setClusterCIDRs      = "cluster-cidrs"
	setNodePortIPs       = "nodeport-ips"
	setHairpin           = "hairpin"
	setClusterIPs        = "cluster-ips"
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

func chainSuffix(n model.ServicePortName) string {
	s := n.Namespace + "/" + n.Name + "/" + strings.ToLower(string(n.Protocol))
	if n.Port != "" {
		s += "/" + n.Port
	}
	return s
}

// numShards is the number of endpoint maps (and affinity maps). Every rule
// that looks up a map with a data register is a "binding" of that map,
// and the kernel walks a map's bindings (and its elements) each time it
// adds one, so one map looked up by 10,000 service rules costs seconds.
// Spreading the service ports over a fixed number of maps keeps both walks
// short while the number of sets stays constant.
const numShards = 64

// shardOf returns the shard of an endpoint group: both groups of a service
// port share one.
func shardOf(group uint32) uint32 { return (group / 2) % numShards }

func endpointsMap(shard uint32) string { return fmt.Sprintf("%s%02d", setEndpointsPrefix, shard) }
func affinityMap(shard uint32) string  { return fmt.Sprintf("%s%02d", setAffinityPrefix, shard) }

// Registers. nf_tables has sixteen 32-bit registers (NFT_REG32_00..15);
// concatenated keys occupy consecutive ones. The kernel only lets a rule
// read registers it wrote itself.
func reg(n uint32) uint32 { return unix.NFT_REG32_00 + n }

// regVerdict is the verdict register, the destination of a vmap lookup.
const regVerdict = unix.NFT_REG_VERDICT

// familyInfo holds what differs between IPv4 and IPv6.
type familyInfo struct {
	fam         model.IPFamily
	proto       byte // NFPROTO_IPV4 or NFPROTO_IPV6
	tableFam    nftables.TableFamily
	addrLen     uint32 // 4 or 16
	saddrOff    uint32 // in the network header
	daddrOff    uint32
	addrType    nftables.SetDatatype
	portUnreach uint8 // ICMP code for "port unreachable"
}

func familyInfoOf(f model.IPFamily) familyInfo {
	if f == model.IPv6 {
		return familyInfo{fam: f, proto: unix.NFPROTO_IPV6, tableFam: nftables.TableFamilyIPv6,
			addrLen: 16, saddrOff: 8, daddrOff: 24, addrType: nftables.TypeIP6Addr, portUnreach: 4}
	}
	return familyInfo{fam: f, proto: unix.NFPROTO_IPV4, tableFam: nftables.TableFamilyIPv4,
		addrLen: 4, saddrOff: 12, daddrOff: 16, addrType: nftables.TypeIPAddr, portUnreach: 3}
}

// addrRegs is the number of registers an address takes.
func (fi *familyInfo) addrRegs() uint32 { return fi.addrLen / 4 }

// Key encodings. Concatenated keys pad each field to 4 bytes. Ids and
// indexes are in host byte order (as numgen writes them); addresses, ports
// and protocols in network byte order.

func (fi *familyInfo) addr(a netip.Addr) []byte {
	if fi.addrLen == 4 {
		b := a.Unmap().As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

func l4proto(p model.Protocol) byte {
	switch p {
	case model.TCP:
		return unix.IPPROTO_TCP
	case model.UDP:
		return unix.IPPROTO_UDP
	case model.SCTP:
		return unix.IPPROTO_SCTP
	}
	return 0
}

func port(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// ipKey is the key of setServiceIPs, setNoEndpointIPs and setFirewallIPs:
// daddr . l4proto . dport.
func (fi *familyInfo) ipKey(a netip.Addr, p model.Protocol, pt uint16) []byte {
	k := append(fi.addr(a), l4proto(p), 0, 0, 0)
	return append(k, port(pt)...)
}

// portKey is the key of the node port maps: l4proto . dport.
func portKey(p model.Protocol, pt uint16) []byte {
	return append([]byte{l4proto(p), 0, 0, 0}, port(pt)...)
}

// endpointKey is the key of the endpoint maps: group . index.
func endpointKey(group, idx uint32) []byte { return append(u32(group), u32(idx)...) }

// endpointVal is an endpoint as map data: addr . port.
func (fi *familyInfo) endpointVal(ap netip.AddrPort) []byte {
	return append(fi.addr(ap.Addr()), port(ap.Port())...)
}

// setSpecs returns the table's sets and maps.
func (fi *familyInfo) setSpecs(affinitySize uint32) []*setSpec {
	addr := fi.addrType
	ipKey := nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	portKeyT := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	idPair := nftables.MustConcatSetType(nftables.TypeMark, nftables.TypeMark)
	ep := nftables.MustConcatSetType(addr, nftables.TypeInetService)
	idAddr := nftables.MustConcatSetType(nftables.TypeMark, addr)
	idEp := nftables.MustConcatSetType(nftables.TypeMark, addr, nftables.TypeInetService)
	fwAllow := nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService, addr)
	pair := nftables.MustConcatSetType(addr, addr)
	verdictMap := func(name string, key nftables.SetDatatype, comment string) *setSpec {
		return &setSpec{name: name, keyType: key.GetNFTMagic(), keyLen: key.Bytes, isMap: true,
			dataType: unix.NFT_DATA_VERDICT, comment: comment}
	}
	specs := []*setSpec{
		verdictMap(setServiceIPs, ipKey, "cluster, external and load-balancer IPs: daddr . proto . port -> service chain"),
		verdictMap(setServiceNodePorts, portKeyT, "node ports: proto . port -> external chain"),
		verdictMap(setNoEndpointIPs, ipKey, "service addresses without usable endpoints -> reject or drop"),
		verdictMap(setNoEndpointPorts, portKeyT, "node ports without usable endpoints -> reject or drop"),
		{name: setAffinityEndpoints, keyType: idEp.GetNFTMagic(), keyLen: idEp.Bytes,
			comment: "current endpoints of groups with session affinity"},
		{name: setFirewallIPs, keyType: ipKey.GetNFTMagic(), keyLen: ipKey.Bytes,
			comment: "load-balancer IPs with source ranges"},
		{name: setFirewallAllow, keyType: fwAllow.GetNFTMagic(), keyLen: fwAllow.Bytes, interval: true,
			fields: []uint32{fi.addrLen, 1, 2, fi.addrLen}, comment: "allowed sources of load-balancer IPs"},
		{name: setClusterCIDRs, keyType: addr.GetNFTMagic(), keyLen: addr.Bytes, interval: true,
			comment: "pod networks"},
		{name: setNodePortIPs, keyType: addr.GetNFTMagic(), keyLen: addr.Bytes, interval: true,
			comment: "node addresses node ports open on"},
		{name: setHairpin, keyType: pair.GetNFTMagic(), keyLen: pair.Bytes,
			comment: "endpoint . endpoint: a pod reaching itself through a service"},
		{name: setClusterIPs, keyType: addr.GetNFTMagic(), keyLen: addr.Bytes,
			comment: "cluster IPs; other ports on them are rejected"},
	}
	for s := range uint32(numShards) {
		specs = append(specs,
			&setSpec{name: endpointsMap(s), keyType: idPair.GetNFTMagic(), keyLen: idPair.Bytes, isMap: true,
				dataType: ep.GetNFTMagic(), dataLen: ep.Bytes, comment: "endpoint group . index -> endpoint"},
			&setSpec{name: affinityMap(s), keyType: idAddr.GetNFTMagic(), keyLen: idAddr.Bytes, isMap: true,
				dataType: idEp.GetNFTMagic(), dataLen: idEp.Bytes, timeout: true, dynamic: true, size: affinitySize,
				comment: "session affinity: endpoint group . client -> group . endpoint"})
	}
	return specs
}
