package nftables

import (
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file builds the expressions of every rule the backend programs.
// Each builder returns a rule as a slice of expressions; the renderer
// encodes them once.

type rule = []expr.Any

// rtnLocal is RTN_LOCAL, the fib address type of local addresses.
const rtnLocal = 2

func (fi *familyInfo) loadSaddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: fi.saddrOff, Len: fi.addrLen}
}

func (fi *familyInfo) loadDaddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: fi.daddrOff, Len: fi.addrLen}
}

func loadL4Proto(r uint32) expr.Any {
	return &expr.Meta{Key: expr.MetaKey(unix.NFT_META_L4PROTO), Register: r}
}

func loadDport(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// ipKeyExprs loads daddr . l4proto . dport into consecutive registers from
// reg(0) and returns the register after the key.
func (fi *familyInfo) ipKeyExprs() (rule, uint32) {
	n := fi.addrRegs()
	return rule{fi.loadDaddr(reg(0)), loadL4Proto(reg(n)), loadDport(reg(n + 1))}, n + 2
}

func portKeyExprs() rule {
	return rule{loadL4Proto(reg(0)), loadDport(reg(1))}
}

func lookup(set string, r uint32, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: r, SetName: set, Invert: invert}
}

func vmap(set string, r uint32) expr.Any {
	return &expr.Lookup{SourceRegister: r, DestRegister: regVerdict, IsDestRegSet: true, SetName: set}
}

func goTo(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }
func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func ctStateNew() rule {
	return rule{
		&expr.Ct{Register: reg(0), Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4,
			Mask: u32(expr.CtStateBitNEW), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: u32(0)},
	}
}

// fibLocal matches packets whose source (saddr) or destination address is
// local.
func fibLocal(saddr bool, op expr.CmpOp) rule {
	return rule{
		&expr.Fib{Register: reg(0), ResultADDRTYPE: true, FlagSADDR: saddr, FlagDADDR: !saddr},
		&expr.Cmp{Op: op, Register: reg(0), Data: u32(rtnLocal)},
	}
}

// notLoopbackDaddr excludes 127.0.0.0/8 or ::1 as destinations.
func (fi *familyInfo) notLoopbackDaddr() rule {
	if fi.addrLen == 4 {
		return rule{
			fi.loadDaddr(reg(0)),
			&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4,
				Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: []byte{127, 0, 0, 0}},
		}
	}
	one := make([]byte, 16)
	one[15] = 1
	return rule{fi.loadDaddr(reg(0)), &expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: one}}
}

// setMark ORs bit into the packet mark.
func setMark(bit uint32) rule {
	return rule{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg(0)},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: u32(^bit), Xor: u32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)},
	}
}

// masqueradeMarked masquerades packets carrying bit, clearing it.
func masqueradeMarked(bit uint32) rule {
	return rule{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg(0)},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(1), Len: 4, Mask: u32(bit), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(1), Data: u32(0)},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: u32(^bit), Xor: u32(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)},
		&expr.Masq{FullyRandom: true},
	}
}

// copyReg copies n registers from src to dst.
func copyReg(src, dst, n uint32) expr.Any {
	ones := make([]byte, 4*n)
	for i := range ones {
		ones[i] = 0xff
	}
	return &expr.Bitwise{SourceRegister: src, DestRegister: dst, Len: 4 * n, Mask: ones, Xor: make([]byte, 4*n)}
}

func (fi *familyInfo) dnat(addr, port uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fi.proto), RegAddrMin: addr, RegProtoMin: port, Specified: true}
}

// randomIndex writes a random index below n to r.
func randomIndex(r uint32, n int) expr.Any {
	if n > 1 {
		return &expr.Numgen{Register: r, Modulus: uint32(n), Type: unix.NFT_NG_RANDOM}
	}
	return &expr.Immediate{Register: r, Data: u32(0)}
}

// selectRules balance over the n endpoints of group: a random index
// below n, the endpoint at group . index in the group's endpoint map, DNAT
// to it:
//
//	dnat to group . numgen random mod n map @endpoints-SHARD
//
// With affinity timeout t > 0 a first rule looks up the client's recorded
// endpoint, checks that it still belongs to the group, refreshes the
// record and DNATs to it; the balancing rule replaces the record.
func (fi *familyInfo) selectRules(group, shard uint32, n int, t time.Duration) []rule {
	a := fi.addrRegs()
	eps, aff := endpointsMap(shard), affinityMap(shard)
	id := func(r uint32) expr.Any { return &expr.Immediate{Register: r, Data: u32(group)} }
	// reg 0: group, 1: index; 2..: endpoint addr . port.
	pick := rule{
		id(reg(0)),
		randomIndex(reg(1), n),
		&expr.Lookup{SourceRegister: reg(0), DestRegister: reg(2), IsDestRegSet: true, SetName: eps},
	}
	if t <= 0 {
		return []rule{append(pick, fi.dnat(reg(2), reg(2+a)))}
	}
	// The affinity map's data is the whole record group . addr . port,
	// so the check against affinity-endpoints reads one lookup's result
	// (which nft can also print).
	// reg 0: group, 1..: saddr; then 1..: the record; a+3..: group .
	// saddr for the refresh.
	hitKey := reg(a + 3)
	hit := rule{
		id(reg(0)),
		fi.loadSaddr(reg(1)),
		&expr.Lookup{SourceRegister: reg(0), DestRegister: reg(1), IsDestRegSet: true, SetName: aff},
		lookup(setAffinityEndpoints, reg(1), false),
		id(hitKey),
		fi.loadSaddr(hitKey + 1),
		&expr.Dynset{SrcRegKey: hitKey, SrcRegData: reg(1), SetName: aff,
			Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: t},
		fi.dnat(reg(2), reg(2+a)),
	}
	// reg 0: group, 1: index; 3..: endpoint, 2..: group . endpoint;
	// a+4..: group . saddr.
	missKey := reg(a + 4)
	miss := rule{
		id(reg(0)),
		randomIndex(reg(1), n),
		&expr.Lookup{SourceRegister: reg(0), DestRegister: reg(3), IsDestRegSet: true, SetName: eps},
		id(reg(2)),
		id(missKey),
		fi.loadSaddr(missKey + 1),
		// A map needs a data register even to delete.
		&expr.Dynset{SrcRegKey: missKey, SrcRegData: reg(2), SetName: aff, Operation: nftDynsetOpDelete},
		&expr.Dynset{SrcRegKey: missKey, SrcRegData: reg(2), SetName: aff,
			Operation: unix.NFT_DYNSET_OP_ADD, Timeout: t},
		fi.dnat(reg(3), reg(3+a)),
	}
	return []rule{hit, miss}
}

// nftDynsetOpDelete is NFT_DYNSET_OP_DELETE (Linux 5.13).
const nftDynsetOpDelete = 2

func (fi *familyInfo) rejectRule() rule {
	return rule{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: fi.portUnreach}}
}

// nodePortMatch matches packets to the node addresses node ports open on.
func (fi *familyInfo) nodePortMatch(haveAddrs bool) rule {
	if haveAddrs {
		return rule{fi.loadDaddr(reg(0)), lookup(setNodePortIPs, reg(0), false)}
	}
	return append(fibLocal(false, expr.CmpOpEq), fi.notLoopbackDaddr()...)
}

// firewallRule drops new connections to a load-balancer IP with source
// ranges from sources outside them. Traffic from the node itself passes.
func (fi *familyInfo) firewallRule() rule {
	r := ctStateNew()
	r = append(r, fibLocal(true, expr.CmpOpNeq)...)
	key, next := fi.ipKeyExprs()
	r = append(r, key...)
	r = append(r, lookup(setFirewallIPs, reg(0), false), fi.loadSaddr(reg(next)),
		lookup(setFirewallAllow, reg(0), true), &expr.Verdict{Kind: expr.VerdictDrop})
	return r
}

// skeleton returns the fixed chains and their rules, in creation order.
// Regular chains come first so base chains can jump to them.
func (fi *familyInfo) skeleton(bit uint32, nodePortAddrs bool, masqAll bool, clusterCIDRs bool) []chainObj {
	var chains []chainObj
	add := func(name string, h *hook, rules ...rule) {
		chains = append(chains, chainObj{name: name, hook: h, rules: rules})
	}
	ipKey, _ := fi.ipKeyExprs()

	add(chainReject, nil, fi.rejectRule())
	add(chainEndpointsCheck, nil,
		append(ipKey[:len(ipKey):len(ipKey)], vmap(setNoEndpointIPs, reg(0))),
		append(fi.nodePortMatch(nodePortAddrs), append(portKeyExprs(), vmap(setNoEndpointPorts, reg(0)))...),
	)
	add(chainServices, nil,
		append(ipKey[:len(ipKey):len(ipKey)], vmap(setServiceIPs, reg(0))),
		append(fi.nodePortMatch(nodePortAddrs), append(portKeyExprs(), vmap(setServiceNodePorts, reg(0)))...),
	)
	switch {
	case masqAll:
		add(chainMasqCluster, nil, setMark(bit))
	case clusterCIDRs:
		add(chainMasqCluster, nil,
			append(rule{fi.loadSaddr(reg(0)), lookup(setClusterCIDRs, reg(0), true)}, setMark(bit)...))
	}

	newCheck := append(ctStateNew(), jump(chainEndpointsCheck))
	clusterIPReject := append(ctStateNew(), fi.loadDaddr(reg(0)), lookup(setClusterIPs, reg(0), false), goTo(chainReject))
	add(chainFilterPrerouting, &hook{unix.NF_INET_PRE_ROUTING, prioFilterPreDNAT, "filter"}, fi.firewallRule())
	add(chainFilterInput, &hook{unix.NF_INET_LOCAL_IN, prioFilterPreDNAT, "filter"}, newCheck)
	add(chainFilterForward, &hook{unix.NF_INET_FORWARD, prioFilterPreDNAT, "filter"}, newCheck, clusterIPReject)
	add(chainFilterOutput, &hook{unix.NF_INET_LOCAL_OUT, prioFilterPreDNAT, "filter"}, newCheck)
	add(chainFilterOutputPost, &hook{unix.NF_INET_LOCAL_OUT, prioFilterPostDNAT, "filter"}, clusterIPReject)
	add(chainNATPrerouting, &hook{unix.NF_INET_PRE_ROUTING, prioDNAT, "nat"}, rule{jump(chainServices)})
	add(chainNATOutput, &hook{unix.NF_INET_LOCAL_OUT, prioDNAT, "nat"}, rule{jump(chainServices)})
	add(chainNATPostrouting, &hook{unix.NF_INET_POST_ROUTING, prioSNAT, "nat"},
		masqueradeMarked(bit),
		rule{fi.loadSaddr(reg(0)), fi.loadDaddr(reg(fi.addrRegs())), lookup(setHairpin, reg(0), false), &expr.Masq{FullyRandom: true}},
	)
	return chains
}
