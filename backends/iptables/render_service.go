package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file renders one service port: the addresses it serves, its
// endpoint (SEP) chains, the balancing chains of cluster traffic (SVC),
// external traffic (EXT, XLB, and ALL for the short circuit of a service
// with both policies Local), its source ranges (FW) and the filter rules
// that reject or drop what has no endpoint.
//
// Its strings are written into one buffer and cut from one string, so a
// service port costs a few allocations rather than a few per endpoint: a
// complete rewrite renders every service port.
//
// Rules enter the SVC, XLB, EXT and SEP chains with a goto (-g), not a
// jump: none of them ever returns (the SEP chains end in a DNAT that
// matches every packet reaching them, the others in an unconditional
// goto), so the packet's path is the same, and iptables-legacy-restore
// parses a goto without looking the chain's name up in libxtables' list
// of known non-targets, whose buckets hold every chain of the input: at
// 100,000 endpoints that lookup was a third of the program's time. Only
// the FW chains, which return what they do not accept, are jumped to.

// svcRender is the rendering of one service port in progress: what its
// parts share.
type svcRender struct {
	*renderer
	w       *rbuf
	sp      *model.ServicePort
	proto   string
	svcName string
	// clusterIP is the cluster IP, if any; extDsts and lbDsts the
	// external and load-balancer addresses, without repeats.
	clusterIP       netip.Addr
	extDsts, lbDsts []netip.Addr
	// affinity is the session affinity timeout in seconds; 0: none.
	affinity int
	// all are the endpoints with a SEP chain; seps[i] is the string
	// index of the name of all[i]'s chain.
	all  []netip.AddrPort
	seps []int
}

// service renders one service port.
func (r *renderer) service(name model.ServicePortName, sp *model.ServicePort, t *proxier.Targets) (rendering, error) {
	if t == nil {
		t = &proxier.Targets{}
	}
	var extBuf, lbBuf [4]netip.Addr
	s := &svcRender{renderer: r, sp: sp, extDsts: extBuf[:0], lbDsts: lbBuf[:0]}
	if err := s.addresses(); err != nil {
		return rendering{}, err
	}
	s.w = getRbuf()
	defer putRbuf(s.w)
	s.proto = protoName(sp.Protocol)
	s.svcName = name.String()

	external := sp.ExternallyAccessible()
	if !t.HasEndpoints {
		s.filterAll(true, "has no endpoints", "REJECT")
		if external {
			s.filterAll(false, "has no endpoints", "REJECT")
		}
		return s.w.rendering(), nil
	}
	if sp.SessionAffinity {
		s.affinity = int(sp.AffinityTimeout / time.Second)
		if s.affinity <= 0 {
			s.affinity = int(model.DefaultAffinityTimeout / time.Second)
		}
	}
	internal, externalEps := r.endpoints(t.Internal), r.endpoints(t.External)
	var wideEps []netip.AddrPort
	if t.Cluster != nil {
		wideEps = r.endpoints(t.Cluster)
	}
	g := s.endpointChains(internal, externalEps, wideEps, t.Cluster != nil)
	s.w.hashIn = append(s.w.hashIn[:0], s.svcName...)
	svc := s.chainName(kindSVC)
	hasSVC := s.clusterIP.IsValid() && len(internal) > 0
	if hasSVC {
		s.clusterChain(svc, len(internal))
	} else if s.clusterIP.IsValid() {
		s.filterAll(true, "has no local endpoints", "DROP")
	}
	if external {
		s.externalChains(svc, hasSVC, g)
	}
	return s.w.rendering(), nil
}

// addresses checks the service port's addresses and collects its
// external and load-balancer ones.
func (s *svcRender) addresses() error {
	sp := s.sp
	if !sp.Protocol.Valid() {
		return fmt.Errorf("unsupported protocol %q", sp.Protocol)
	}
	if sp.ClusterIP.IsValid() {
		if !s.fam.Contains(sp.ClusterIP) {
			return fmt.Errorf("cluster IP %s is not %s", sp.ClusterIP, s.fam)
		}
		if sp.Port == 0 {
			return errors.New("port 0")
		}
		s.clusterIP = sp.ClusterIP.Unmap()
	}
	for i, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if !s.fam.Contains(a) {
			return fmt.Errorf("address %s is not %s", a, s.fam)
		}
		if sp.Port == 0 {
			return errors.New("port 0")
		}
		a = a.Unmap()
		if slices.Contains(s.extDsts, a) || slices.Contains(s.lbDsts, a) {
			continue
		}
		if i < len(sp.ExternalIPs) {
			s.extDsts = append(s.extDsts, a)
		} else {
			s.lbDsts = append(s.lbDsts, a)
		}
	}
	return nil
}

// dst writes the match of address a and the service port.
func (s *svcRender) dst(a netip.Addr) {
	w := s.w
	w.b = append(w.b, "-d "...)
	w.b = a.AppendTo(w.b)
	w.b = append(w.b, s.hostBits...)
	w.b = append(w.b, ' ')
	w.proto(s.proto)
	w.b = append(w.b, " --dport "...)
	w.b = strconv.AppendUint(w.b, uint64(s.sp.Port), 10)
}

// nodePort writes the node port match.
func (s *svcRender) nodePort() {
	w := s.w
	w.proto(s.proto)
	w.b = append(w.b, " --dport "...)
	w.b = strconv.AppendUint(w.b, uint64(s.sp.NodePort), 10)
}

// chainName writes the name of the service port's chain of a kind (from
// w.hashIn) and returns its string index.
func (s *svcRender) chainName(kind string) int {
	s.w.b = s.n.appendChain(s.w.b, kind, s.w.hashIn)
	return s.w.end()
}

// filterAll rejects or drops, in filter, the cluster IP (cluster) or
// every external address and the node port (!cluster).
func (s *svcRender) filterAll(cluster bool, why, verdict string) {
	w := s.w
	if cluster {
		if s.clusterIP.IsValid() {
			w.comment(s.svcName, " ", why)
			s.dst(s.clusterIP)
			w.shared(tFilter, s.fServices, " -j ", verdict)
		}
		return
	}
	for _, a := range slices.Concat(s.extDsts, s.lbDsts) {
		w.comment(s.svcName, " ", why)
		s.dst(a)
		w.shared(tFilter, s.fExternal, " -j ", verdict)
	}
	if s.sp.NodePort != 0 {
		w.comment(s.svcName, " ", why)
		s.nodePort()
		w.shared(tFilter, s.fNodePorts, " -j ", verdict)
	}
}

// groups places the endpoint groups among the SEP chains: the internal
// group is all[0:len(internal)], the others are indexes into all.
type groups struct {
	// extIdx are the external endpoints' indexes; same reports whether
	// they are the internal ones, in order.
	extIdx []int
	same   bool
	// wide reports a cluster-wide group (proxier.Targets.Cluster, for a
	// service with both policies Local); wideIdx are its indexes.
	wide    bool
	wideIdx []int
}

// endpointChains writes the SEP chains, shared by the balancing chains:
// all holds the internal endpoints, then the external and cluster-wide
// ones not among them.
func (s *svcRender) endpointChains(internal, externalEps, wideEps []netip.AddrPort, wide bool) groups {
	g := groups{extIdx: make([]int, len(externalEps)), same: len(internal) == len(externalEps), wide: wide}
	all := internal
	var pos map[netip.AddrPort]int
	if len(internal) > 16 {
		pos = make(map[netip.AddrPort]int, len(internal))
		for i, ep := range internal {
			pos[ep] = i
		}
	}
	for j, ep := range externalEps {
		i := -1
		if pos != nil {
			if k, ok := pos[ep]; ok {
				i = k
			}
		} else {
			i = slices.Index(internal, ep)
		}
		if i < 0 {
			g.same = false
			if len(all) == len(internal) {
				all = slices.Clip(all)
			}
			i = len(all)
			all = append(all, ep)
		}
		g.extIdx[j] = i
	}
	if wide {
		g.wideIdx = make([]int, len(wideEps))
		for j, ep := range wideEps {
			i := slices.Index(all, ep)
			if i < 0 {
				all = append(slices.Clip(all), ep)
				i = len(all) - 1
			}
			g.wideIdx[j] = i
		}
	}
	s.all = all
	w := s.w
	s.seps = make([]int, len(all))
	for i, ep := range all {
		w.hashIn = ep.AppendTo(append(append(w.hashIn[:0], s.svcName...), '|'))
		w.b = s.n.appendChain(w.b, kindSEP, w.hashIn)
		s.seps[i] = w.end()
	}
	for i, ep := range all {
		first := len(w.ends)
		w.b = append(w.b, "-s "...)
		w.b = ep.Addr().AppendTo(w.b)
		w.b = append(w.b, s.hostBits...)
		w.b = append(w.b, ' ')
		w.b = append(w.b, s.markRule...)
		w.end()
		w.b = append(w.b, "-p "...)
		w.b = append(w.b, s.proto...)
		if s.affinity > 0 {
			w.b = append(w.b, " -m recent --name "...)
			w.b = w.appendStr(w.b, s.seps[i])
			w.b = append(w.b, " --set"...)
		}
		w.b = append(w.b, " -j DNAT --to-destination "...)
		w.b = ep.AppendTo(w.b)
		w.end()
		w.chain(s.seps[i], first)
	}
	return g
}

// balance writes the rules picking one of the n endpoints idx(0..n-1)
// (indexes in all), after the rules from string first on, and adds the
// chain named by string chain. idx nil is the identity.
func (s *svcRender) balance(chain int, idx func(int) int, n, first int) {
	w := s.w
	sep := func(k int) int {
		if idx == nil {
			return s.seps[k]
		}
		return s.seps[idx(k)]
	}
	if s.affinity > 0 {
		for k := range n {
			w.b = append(w.b, "-m recent --name "...)
			w.b = w.appendStr(w.b, sep(k))
			w.b = append(w.b, " --rcheck --seconds "...)
			w.b = strconv.AppendInt(w.b, int64(s.affinity), 10)
			w.b = append(w.b, " --reap "...)
			w.gotoChain(sep(k))
		}
	}
	for k := range n {
		if k < n-1 {
			w.b = append(w.b, "-m statistic --mode random --probability "...)
			w.b = strconv.AppendFloat(w.b, 1/float64(n-k), 'f', 10, 64)
			w.b = append(w.b, ' ')
		}
		w.gotoChain(sep(k))
	}
	w.chain(chain, first)
}

// clusterChain writes the SVC chain, which balances cluster traffic over
// the n internal endpoints, and the cluster IP's rule in SERVICES.
func (s *svcRender) clusterChain(svc, n int) {
	w := s.w
	first := len(w.ends)
	// The masquerade rules match the cluster IP: external traffic that a
	// Local service's EXT chain sends here (pods and the node) is not
	// cluster IP traffic (as in kube-proxy).
	switch {
	case s.masqAll:
		s.dst(s.clusterIP)
		w.str(" ", s.markRule)
	case len(s.cidrs) == 1:
		s.dst(s.clusterIP)
		w.str(" ! -s ", s.cidrs[0].String(), " ", s.markRule)
	case len(s.cidrs) > 1:
		s.dst(s.clusterIP)
		w.str(" -j ", s.fMarkOutside)
	}
	s.balance(svc, nil, n, first)
	w.comment(s.svcName, " cluster IP")
	s.dst(s.clusterIP)
	w.sharedJump(tNAT, s.fServices, " -g ", svc)
}

// externalChains writes what serves the external addresses and the node
// port: the EXT chain, XLB (policy Local, or endpoints other than the
// cluster ones), ALL (the short circuit over the cluster-wide group), FW
// (source ranges) and their rules in the fixed chains.
func (s *svcRender) externalChains(svc int, hasSVC bool, g groups) {
	w, sp := s.w, s.sp
	nExt, nWide := len(g.extIdx), len(g.wideIdx)
	// Pods and the node itself reach a Local service's external
	// addresses through its cluster-wide endpoints (kube-proxy's
	// "short-circuit" rules), also when the node has no local endpoint.
	shortCircuit := sp.ExternalPolicy == model.PolicyLocal && hasSVC
	short := svc // the chain that balances them
	if g.wide {
		shortCircuit = sp.ExternalPolicy == model.PolicyLocal && nWide > 0
		if shortCircuit {
			short = s.chainName(kindALL)
		}
	}
	if nExt == 0 {
		// What the EXT chain does not send on is dropped in filter,
		// after DNAT.
		s.filterAll(false, "has no local endpoints", "DROP")
		if !shortCircuit {
			// Nothing is DNATed; the node's own traffic from outside
			// the source ranges is dropped by FIREWALL (OUTPUT) as in
			// kube-proxy, not sent out.
			if len(sp.LoadBalancerSourceRanges) > 0 {
				for _, a := range s.lbDsts {
					w.comment(s.svcName, " traffic not accepted by its source ranges")
					s.dst(a)
					w.shared(tFilter, s.fFirewall, " -j DROP")
				}
			}
			return
		}
	}
	ext, xlb := s.chainName(kindEXT), s.chainName(kindXLB)
	useXLB := nExt > 0
	first := len(w.ends)
	if sp.ExternalPolicy != model.PolicyLocal {
		w.str(s.markRule)
		if hasSVC && g.same {
			w.gotoChain(svc)
			useXLB = false
		}
	} else if shortCircuit {
		// Pods keep their address; the node's own traffic is
		// masqueraded (its source would be the external address itself).
		for _, p := range s.cidrs {
			w.b = append(w.b, "-s "...)
			w.b = p.AppendTo(w.b)
			w.b = append(w.b, ' ')
			w.gotoChain(short)
		}
		w.str("-m addrtype --src-type LOCAL ", s.markRule)
		w.b = append(w.b, "-m addrtype --src-type LOCAL "...)
		w.gotoChain(short)
	}
	if useXLB {
		w.gotoChain(xlb)
	}
	w.chain(ext, first)
	if useXLB {
		s.balance(xlb, func(k int) int { return g.extIdx[k] }, nExt, len(w.ends))
	}
	if g.wide && shortCircuit {
		s.balance(short, func(k int) int { return g.wideIdx[k] }, nWide, len(w.ends))
	}
	for _, a := range s.extDsts {
		w.comment(s.svcName, " external IP")
		s.dst(a)
		w.sharedJump(tNAT, s.fServices, " -g ", ext)
	}
	s.loadBalancers(ext)
	if sp.NodePort != 0 {
		w.comment(s.svcName)
		s.nodePort()
		w.sharedJump(tNAT, s.fNodePorts, " -g ", ext)
	}
}

// loadBalancers sends the load-balancer addresses to the EXT chain (named
// by string ext), through a FW chain of the source ranges when there are
// some.
func (s *svcRender) loadBalancers(ext int) {
	w, sp := s.w, s.sp
	if len(s.lbDsts) == 0 || len(sp.LoadBalancerSourceRanges) == 0 {
		for _, a := range s.lbDsts {
			w.comment(s.svcName, " loadbalancer IP")
			s.dst(a)
			w.sharedJump(tNAT, s.fServices, " -g ", ext)
		}
		return
	}
	fw := s.chainName(kindFW)
	first := len(w.ends)
	for _, p := range sp.LoadBalancerSourceRanges {
		if p.IsValid() && s.fam.Contains(p.Addr()) {
			w.b = append(w.b, "-s "...)
			w.b = unmapPrefix(p).AppendTo(w.b)
			w.b = append(w.b, ' ')
			w.gotoChain(ext)
		}
	}
	// As kube-proxy: when a range holds the node's address, the service's
	// VIPs are sources too (the node reaching a VIP from the VIP). The
	// rest, the node's own traffic included, falls through unDNATed and
	// is dropped by the filter FIREWALL chain.
	if sp.SourceRangesHold(s.nodeIP) {
		for _, a := range s.lbDsts {
			w.b = append(w.b, "-s "...)
			w.b = a.AppendTo(w.b)
			w.b = append(w.b, s.hostBits...)
			w.b = append(w.b, ' ')
			w.gotoChain(ext)
		}
	}
	w.chain(fw, first)
	for _, a := range s.lbDsts {
		w.comment(s.svcName, " loadbalancer IP")
		s.dst(a)
		// A jump: FW returns what it does not accept.
		w.sharedJump(tNAT, s.fServices, " -j ", fw)
		w.b = append(w.b, `-m comment --comment "`...)
		w.b = appendCommentText(w.b, 250, s.svcName, " traffic not accepted by ", string(w.bytes(fw)))
		w.b = append(w.b, `" `...)
		s.dst(a)
		w.shared(tFilter, s.fFirewall, " -j DROP")
	}
}
