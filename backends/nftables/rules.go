package nftables

import (
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/nftnl"
)

// This file builds the expressions of every rule the backend programs,
// from internal/nftnl's shared builders. Each builder returns a rule as a
// slice of expressions; the renderer encodes them once.

type rule = nftnl.Rule

// pick ends a balancing rule whose first three registers hold a range set
// prefix: a random position below randRange completes the key, part part
// of the shard's endpoint maps yields the endpoint whose range holds it,
// DNAT to it. When the part has no such range, the rule ends there.
func (fi *familyInfo) pick(shard, part uint32) rule {
	a := fi.AddrRegs()
	return rule{
		&expr.Numgen{Register: nftnl.Reg(3), Modulus: randRange, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: nftnl.Reg(0), DestRegister: nftnl.Reg(4), IsDestRegSet: true, SetName: endpointsMap(shard, part)},
		fi.DNAT(nftnl.Reg(4), nftnl.Reg(4+a)),
	}
}

// tupleRule balances over the range set named by the packet's destination
// (see tuplePrefix), for the shared chains of service addresses:
//
//	dnat to ip daddr . meta l4proto . th dport . numgen random mod 65535 map @endpoints-SHARD[-PART]
//	dnat to jhash ip6 daddr . meta l4proto . th dport mod 4294967295 seed 0x70726f78 . 0x0 . numgen random mod 65535 map @endpoints-SHARD[-PART]
//
// No rule names a service or depends on its endpoints: adding or removing
// endpoints changes map elements only (a changed rule would make the
// kernel validate the whole table at commit).
func (fi *familyInfo) tupleRule(shard, part uint32) rule {
	key, _ := fi.KeyExprs()
	r := append(rule{}, key...)
	if fi.AddrLen != 4 {
		r = append(r,
			&expr.Hash{SourceRegister: nftnl.Reg(0), DestRegister: nftnl.Reg(0), Length: 24, Modulus: hashModulus,
				Seed: hashSeed, Type: expr.HashTypeJenkins},
			&expr.Immediate{Register: nftnl.Reg(1), Data: make([]byte, 8)})
	}
	return append(r, fi.pick(shard, part)...)
}

// nodePortRule balances over the range set of the packet's node port:
//
//	dnat to 0xffffffff . meta l4proto . th dport . numgen random mod 65535 map @endpoints-SHARD[-PART]
func (fi *familyInfo) nodePortRule(shard, part uint32) rule {
	r := rule{&expr.Immediate{Register: nftnl.Reg(0), Data: nftnl.BE32(tagNodePort)}, nftnl.LoadL4Proto(nftnl.Reg(1)), nftnl.LoadDport(nftnl.Reg(2))}
	return append(r, fi.pick(shard, part)...)
}

// prefixRule balances over the range set with the given prefix, for the
// chain of one service port:
//
//	dnat to PREFIX . numgen random mod 65535 map @endpoints-SHARD[-PART]
func (fi *familyInfo) prefixRule(shard, part uint32, prefix []byte) rule {
	return append(rule{&expr.Immediate{Register: nftnl.Reg(0), Data: prefix}}, fi.pick(shard, part)...)
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
	a := fi.AddrRegs()
	set := affinitySet(shard)
	key := func(aid uint32) rule {
		return rule{&expr.Immediate{Register: nftnl.Reg(0), Data: nftnl.U32(aid)}, fi.LoadSaddr(nftnl.Reg(1))}
	}
	update := &expr.Dynset{SrcRegKey: nftnl.Reg(0), SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: t}
	to := func(ep netip.AddrPort) rule {
		return rule{
			&expr.Immediate{Register: nftnl.Reg(1 + a), Data: fi.Addr(ep.Addr())},
			&expr.Immediate{Register: nftnl.Reg(1 + 2*a), Data: nftnl.Port(ep.Port())[:2]},
			fi.DNAT(nftnl.Reg(1+a), nftnl.Reg(1+2*a)),
		}
	}
	var rules []rule
	for i, ep := range eps {
		r := key(aids[i])
		r = append(r, nftnl.Lookup(set, nftnl.Reg(0), false), update)
		rules = append(rules, append(r, to(ep)...))
	}
	for i, ep := range eps {
		var r rule
		if left := len(eps) - i; left > 1 {
			r = rule{
				&expr.Numgen{Register: nftnl.Reg(0), Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: nftnl.Reg(0), Data: nftnl.U32(0)},
			}
		}
		r = append(r, key(aids[i])...)
		r = append(r, update)
		rules = append(rules, append(r, to(ep)...))
	}
	return rules
}

func (fi *familyInfo) rejectRule() rule { return rule{fi.Reject()} }

// nodePortMatch matches packets to the node addresses node ports open
// on: the node's own addresses (in the configured ranges, if any), never
// loopback ones (as kube-proxy's nftables mode).
func (fi *familyInfo) nodePortMatch(haveAddrs bool) rule {
	r := append(nftnl.FibLocal(false, expr.CmpOpEq), fi.NotLoopbackDaddr()...)
	if haveAddrs {
		r = append(r, fi.LoadDaddr(nftnl.Reg(0)), nftnl.Lookup(setNodePortIPs, nftnl.Reg(0), false))
	}
	return r
}

// firewallRule drops new connections to a load-balancer IP with source
// ranges from sources outside them, the node's own included (as in
// kube-proxy; see renderer.service for the VIP as a source).
func (fi *familyInfo) firewallRule() rule {
	r := nftnl.CtStateNew()
	key, next := fi.KeyExprs()
	r = append(r, key...)
	r = append(r, nftnl.Lookup(setFirewallIPs, nftnl.Reg(0), false), fi.LoadSaddr(nftnl.Reg(next)),
		nftnl.Lookup(setFirewallAllow, nftnl.Reg(0), true), nftnl.Drop())
	return r
}

// sharedChainRules returns the rules of a shared chain (see shardRef):
// the cluster chains masquerade as the table is configured to (masqCluster:
// the chain mark-cluster-masquerade exists), the external and node port
// ones mark for masquerading; all balance by the packet's destination,
// one rule for each part of the shard's endpoint maps in parts (the
// packet's range set is in one of them).
func (fi *familyInfo) sharedChainRules(ref shardRef, parts partSet, bit uint32, masqCluster bool) []rule {
	var out []rule
	switch {
	case ref.kind == objCluster && masqCluster:
		out = append(out, rule{nftnl.Jump(chainMasqCluster)})
	case ref.kind != objCluster:
		out = append(out, nftnl.SetMark(bit))
	}
	for p := range uint32(numParts) {
		if parts&(1<<p) == 0 {
			continue
		}
		if ref.kind == objNodePort {
			out = append(out, fi.nodePortRule(ref.shard, p))
		} else {
			out = append(out, fi.tupleRule(ref.shard, p))
		}
	}
	return out
}

// skeleton returns the fixed chains and their rules, in creation order.
// Regular chains come first so base chains can jump to them.
func (fi *familyInfo) skeleton(bit uint32, nodePortAddrs bool, masqAll bool, clusterCIDRs bool) []chainObj {
	var chains []chainObj
	add := func(name string, h *nftnl.Hook, rules ...rule) {
		chains = append(chains, chainObj{name: name, hook: h, rules: rules})
	}
	ipKey, _ := fi.KeyExprs()

	add(chainReject, nil, fi.rejectRule())
	add(chainEndpointsCheck, nil,
		append(ipKey[:len(ipKey):len(ipKey)], nftnl.VMap(setNoEndpointIPs, nftnl.Reg(0))),
	)
	// Node ports only on input, as kube-proxy: a forwarded packet or
	// one the node sends is never to a node port of its own (the node's
	// own reach input), and the check's FIB lookup would cost every new
	// packet there (every datagram of a flow no reply has come back on).
	add(chainNodePortsCheck, nil,
		append(fi.nodePortMatch(nodePortAddrs), append(nftnl.PortKeyExprs(), nftnl.VMap(setNoEndpointPorts, nftnl.Reg(0)))...),
	)
	add(chainServices, nil,
		append(ipKey[:len(ipKey):len(ipKey)], nftnl.VMap(setServiceIPs, nftnl.Reg(0))),
		append(fi.nodePortMatch(nodePortAddrs), append(nftnl.PortKeyExprs(), nftnl.VMap(setServiceNodePorts, nftnl.Reg(0)))...),
	)
	// Cluster chains are also where a Local service's external addresses
	// send pods and the node (see renderer.service); as in kube-proxy,
	// these masquerade rules apply to cluster IP destinations only.
	toClusterIP := rule{fi.LoadDaddr(nftnl.Reg(0)), nftnl.Lookup(setClusterIPs, nftnl.Reg(0), false)}
	switch {
	case masqAll:
		add(chainMasqCluster, nil, append(toClusterIP, nftnl.SetMark(bit)...))
	case clusterCIDRs:
		add(chainMasqCluster, nil,
			slices.Concat(toClusterIP, rule{fi.LoadSaddr(nftnl.Reg(0)), nftnl.Lookup(setClusterCIDRs, nftnl.Reg(0), true)}, nftnl.SetMark(bit)))
	}

	newCheck := append(nftnl.CtStateNew(), nftnl.Jump(chainEndpointsCheck))
	clusterIPReject := append(nftnl.CtStateNew(), fi.LoadDaddr(nftnl.Reg(0)), nftnl.Lookup(setClusterIPs, nftnl.Reg(0), false), nftnl.Goto(chainReject))
	// After DNAT, as kube-proxy: what is still addressed to the service
	// ranges was not a service's.
	unallocatedDrop := append(nftnl.CtStateNew(), fi.LoadDaddr(nftnl.Reg(0)), nftnl.Lookup(setServiceCIDRs, nftnl.Reg(0), false), nftnl.Drop())
	add(chainFilterPrerouting, &nftnl.Hook{Num: unix.NF_INET_PRE_ROUTING, Priority: prioFilterPreDNAT, Type: "filter"}, fi.firewallRule())
	add(chainFilterOutput, &nftnl.Hook{Num: unix.NF_INET_LOCAL_OUT, Priority: prioFilterPreDNAT, Type: "filter"}, fi.firewallRule())
	add(chainFilterInput, &nftnl.Hook{Num: unix.NF_INET_LOCAL_IN, Priority: prioFilterPreDNAT, Type: "filter"},
		newCheck, append(nftnl.CtStateNew(), nftnl.Jump(chainNodePortsCheck)))
	add(chainFilterForward, &nftnl.Hook{Num: unix.NF_INET_FORWARD, Priority: prioFilterPreDNAT, Type: "filter"}, newCheck, clusterIPReject, unallocatedDrop)
	// The node's own traffic is checked after DNAT, as on input and
	// forward: what a service chain sent on is not dropped.
	add(chainFilterOutputPost, &nftnl.Hook{Num: unix.NF_INET_LOCAL_OUT, Priority: prioFilterPostDNAT, Type: "filter"}, newCheck, clusterIPReject, unallocatedDrop)
	add(chainNATPrerouting, &nftnl.Hook{Num: unix.NF_INET_PRE_ROUTING, Priority: prioDNAT, Type: "nat"}, rule{nftnl.Jump(chainServices)})
	add(chainNATOutput, &nftnl.Hook{Num: unix.NF_INET_LOCAL_OUT, Priority: prioDNAT, Type: "nat"}, rule{nftnl.Jump(chainServices)})
	add(chainNATPostrouting, &nftnl.Hook{Num: unix.NF_INET_POST_ROUTING, Priority: prioSNAT, Type: "nat"},
		nftnl.MasqueradeMarked(bit),
		rule{fi.LoadSaddr(nftnl.Reg(0)), fi.LoadDaddr(nftnl.Reg(fi.AddrRegs())), nftnl.Lookup(setHairpin, nftnl.Reg(0), false), nftnl.Masquerade()},
	)
	return chains
}
