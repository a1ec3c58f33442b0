package nftables

import (
	"net/netip"
	"slices"
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

func (fi *familyInfo) dnat(addr, port uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fi.proto), RegAddrMin: addr, RegProtoMin: port, Specified: true}
}

// pick ends a balancing rule whose first three registers hold a range set
// prefix: a random position below randRange completes the key, the
// endpoint map yields the endpoint whose range holds it, DNAT to it.
func (fi *familyInfo) pick(shard uint32) rule {
	a := fi.addrRegs()
	return rule{
		&expr.Numgen{Register: reg(3), Modulus: randRange, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg(0), DestRegister: reg(4), IsDestRegSet: true, SetName: endpointsMap(shard)},
		fi.dnat(reg(4), reg(4+a)),
	}
}

// tupleRule balances over the range set named by the packet's destination
// (see tuplePrefix), for the shared chains of service addresses:
//
//	dnat to ip daddr . meta l4proto . th dport . numgen random mod 65535 map @endpoints-SHARD
//	dnat to jhash ip6 daddr . meta l4proto . th dport mod 4294967295 seed 0x70726f78 . 0x0 . numgen random mod 65535 map @endpoints-SHARD
//
// No rule names a service or depends on its endpoints: adding or removing
// endpoints changes map elements only (a changed rule would make the
// kernel validate the whole table at commit).
func (fi *familyInfo) tupleRule(shard uint32) rule {
	key, _ := fi.ipKeyExprs()
	r := append(rule{}, key...)
	if fi.addrLen != 4 {
		r = append(r,
			&expr.Hash{SourceRegister: reg(0), DestRegister: reg(0), Length: 24, Modulus: hashModulus,
				Seed: hashSeed, Type: expr.HashTypeJenkins},
			&expr.Immediate{Register: reg(1), Data: make([]byte, 8)})
	}
	return append(r, fi.pick(shard)...)
}

// nodePortRule balances over the range set of the packet's node port:
//
//	dnat to 0xffffffff . meta l4proto . th dport . numgen random mod 65535 map @endpoints-SHARD
func (fi *familyInfo) nodePortRule(shard uint32) rule {
	r := rule{&expr.Immediate{Register: reg(0), Data: be32(tagNodePort)}, loadL4Proto(reg(1)), loadDport(reg(2))}
	return append(r, fi.pick(shard)...)
}

// prefixRule balances over the range set with the given prefix, for the
// chain of one service port:
//
//	dnat to PREFIX . numgen random mod 65535 map @endpoints-SHARD
func (fi *familyInfo) prefixRule(shard uint32, prefix []byte) rule {
	return append(rule{&expr.Immediate{Register: reg(0), Data: prefix}}, fi.pick(shard)...)
}

// affinityRules balance with session affinity over eps, whose affinity
// ids are aids, recording clients in the shard's affinity set for t:
//
//	AID_i . ip saddr @affinity-SHARD update @affinity-SHARD { AID_i . ip saddr timeout T } dnat to EP_i   (each i)
//	numgen random mod (n-i) 0 update @affinity-SHARD { AID_i . ip saddr timeout T } dnat to EP_i       (each i; the last without numgen)
//
// The first rules send a client with a record to its endpoint and refresh
// the record; the others pick an endpoint uniformly (rule i matches with
// probability 1/(n-i) of what reaches it) and record it. A removed
// endpoint's rules go, so its records are never used again; endpoint ids
// are never reused, so its records cannot pin clients to a successor.
// Every expression's input is written by the same rule from the packet or
// a constant, which is what nft can list.
func (fi *familyInfo) affinityRules(shard uint32, aids []uint32, eps []netip.AddrPort, t time.Duration) []rule {
	a := fi.addrRegs()
	set := affinitySet(shard)
	key := func(aid uint32) rule {
		return rule{&expr.Immediate{Register: reg(0), Data: u32(aid)}, fi.loadSaddr(reg(1))}
	}
	update := &expr.Dynset{SrcRegKey: reg(0), SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: t}
	to := func(ep netip.AddrPort) rule {
		return rule{
			&expr.Immediate{Register: reg(1 + a), Data: fi.addr(ep.Addr())},
			&expr.Immediate{Register: reg(1 + 2*a), Data: port(ep.Port())[:2]},
			fi.dnat(reg(1+a), reg(1+2*a)),
		}
	}
	var rules []rule
	for i, ep := range eps {
		r := key(aids[i])
		r = append(r, lookup(set, reg(0), false), update)
		rules = append(rules, append(r, to(ep)...))
	}
	for i, ep := range eps {
		var r rule
		if left := len(eps) - i; left > 1 {
			r = rule{
				&expr.Numgen{Register: reg(0), Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg(0), Data: u32(0)},
			}
		}
		r = append(r, key(aids[i])...)
		r = append(r, update)
		rules = append(rules, append(r, to(ep)...))
	}
	return rules
}

func (fi *familyInfo) rejectRule() rule {
	return rule{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: fi.portUnreach}}
}

// nodePortMatch matches packets to the node addresses node ports open
// on: the node's own addresses (in the configured ranges, if any), never
// loopback ones (as kube-proxy's nftables mode).
func (fi *familyInfo) nodePortMatch(haveAddrs bool) rule {
	r := append(fibLocal(false, expr.CmpOpEq), fi.notLoopbackDaddr()...)
	if haveAddrs {
		r = append(r, fi.loadDaddr(reg(0)), lookup(setNodePortIPs, reg(0), false))
	}
	return r
}

// firewallRule drops new connections to a load-balancer IP with source
// ranges from sources outside them, the node's own included (as in
// kube-proxy; see renderer.service for the VIP as a source).
func (fi *familyInfo) firewallRule() rule {
	r := ctStateNew()
	key, next := fi.ipKeyExprs()
	r = append(r, key...)
	r = append(r, lookup(setFirewallIPs, reg(0), false), fi.loadSaddr(reg(next)),
		lookup(setFirewallAllow, reg(0), true), &expr.Verdict{Kind: expr.VerdictDrop})
	return r
}

// sharedChainRules returns the rules of a shared chain (see shardRef):
// the cluster chains masquerade as the table is configured to (masqCluster:
// the chain mark-cluster-masquerade exists), the external and node port
// ones mark for masquerading; all balance by the packet's destination.
func (fi *familyInfo) sharedChainRules(ref shardRef, bit uint32, masqCluster bool) []rule {
	switch ref.kind {
	case objCluster:
		if masqCluster {
			return []rule{{jump(chainMasqCluster)}, fi.tupleRule(ref.shard)}
		}
		return []rule{fi.tupleRule(ref.shard)}
	case objExternal:
		return []rule{setMark(bit), fi.tupleRule(ref.shard)}
	}
	return []rule{setMark(bit), fi.nodePortRule(ref.shard)}
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
	// Cluster chains are also where a Local service's external addresses
	// send pods and the node (see renderer.service); as in kube-proxy,
	// these masquerade rules apply to cluster IP destinations only.
	toClusterIP := rule{fi.loadDaddr(reg(0)), lookup(setClusterIPs, reg(0), false)}
	switch {
	case masqAll:
		add(chainMasqCluster, nil, append(toClusterIP, setMark(bit)...))
	case clusterCIDRs:
		add(chainMasqCluster, nil,
			slices.Concat(toClusterIP, rule{fi.loadSaddr(reg(0)), lookup(setClusterCIDRs, reg(0), true)}, setMark(bit)))
	}

	newCheck := append(ctStateNew(), jump(chainEndpointsCheck))
	clusterIPReject := append(ctStateNew(), fi.loadDaddr(reg(0)), lookup(setClusterIPs, reg(0), false), goTo(chainReject))
	// After DNAT, as kube-proxy: what is still addressed to the service
	// ranges was not a service's.
	unallocatedDrop := append(ctStateNew(), fi.loadDaddr(reg(0)), lookup(setServiceCIDRs, reg(0), false), &expr.Verdict{Kind: expr.VerdictDrop})
	add(chainFilterPrerouting, &hook{unix.NF_INET_PRE_ROUTING, prioFilterPreDNAT, "filter"}, fi.firewallRule())
	add(chainFilterOutput, &hook{unix.NF_INET_LOCAL_OUT, prioFilterPreDNAT, "filter"}, fi.firewallRule())
	add(chainFilterInput, &hook{unix.NF_INET_LOCAL_IN, prioFilterPreDNAT, "filter"}, newCheck)
	add(chainFilterForward, &hook{unix.NF_INET_FORWARD, prioFilterPreDNAT, "filter"}, newCheck, clusterIPReject, unallocatedDrop)
	// The node's own traffic is checked after DNAT, as on input and
	// forward: what a service chain sent on is not dropped.
	add(chainFilterOutputPost, &hook{unix.NF_INET_LOCAL_OUT, prioFilterPostDNAT, "filter"}, newCheck, clusterIPReject, unallocatedDrop)
	add(chainNATPrerouting, &hook{unix.NF_INET_PRE_ROUTING, prioDNAT, "nat"}, rule{jump(chainServices)})
	add(chainNATOutput, &hook{unix.NF_INET_LOCAL_OUT, prioDNAT, "nat"}, rule{jump(chainServices)})
	add(chainNATPostrouting, &hook{unix.NF_INET_POST_ROUTING, prioSNAT, "nat"},
		masqueradeMarked(bit),
		rule{fi.loadSaddr(reg(0)), fi.loadDaddr(reg(fi.addrRegs())), lookup(setHairpin, reg(0), false), &expr.Masq{FullyRandom: true}},
	)
	return chains
}
