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

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file renders desired state into kernel objects: the chains, rules
// and set elements of one service port. Rendering is pure: it reads the
// service, its targets and the previous rendering (to keep endpoint
// indexes stable) and touches nothing.

// DefaultAffinityTimeout is the session affinity timeout used when a
// service asks for affinity without a timeout (Kubernetes' default).
const DefaultAffinityTimeout = 10800 * time.Second

// maxChainName is NFT_NAME_MAXLEN less the terminating NUL.
const maxChainName = 255

// chainObj is a chain and its rules.
type chainObj struct {
	name  string
	hook  *hook  // nil for a regular chain
	rules []rule // as built
	enc   [][]byte
}

// setElem is an element of a named set.
type setElem struct {
	set string
	e   elem
}

// id returns the element's identity within its set.
func (s *setElem) id() string { return string(s.e.key) + "|" + string(s.e.keyEnd) }

// sameData reports whether two elements with the same key carry the same
// data.
func (s *setElem) sameData(o *setElem) bool {
	if !bytes.Equal(s.e.val, o.e.val) || s.e.timeout != o.e.timeout {
		return false
	}
	if (s.e.verdict == nil) != (o.e.verdict == nil) {
		return false
	}
	return s.e.verdict == nil || *s.e.verdict == *o.e.verdict
}

// refcounted sets hold elements several service ports may share; an
// element stays while one of them needs it.
func refcounted(set string) bool { return set == setHairpin || set == setClusterIPs }

// svcObjs is the rendering of one service port.
type svcObjs struct {
	chains []chainObj
	elems  []setElem
	// slots are the endpoints of the internal and external groups, in
	// index order.
	slots [2][]netip.AddrPort
}

// renderer renders service ports for one family and configuration.
type renderer struct {
	fi           familyInfo
	bit          uint32
	masqCluster  bool // chainMasqCluster exists
	clusterCIDRs bool

	// Encoded constant rules.
	jumpMasq, mark []byte
	// templates caches encoded balancing rules per shape; see selectEnc.
	templates map[tmplKey]*tmpl
}

func newRenderer(fi familyInfo, bit uint32, masqAll, clusterCIDRs bool) (*renderer, error) {
	r := &renderer{fi: fi, bit: bit, masqCluster: masqAll || clusterCIDRs, clusterCIDRs: clusterCIDRs,
		templates: map[tmplKey]*tmpl{}}
	var err error
	if r.jumpMasq, err = encodeExprs(fi.proto, rule{jump(chainMasqCluster)}); err != nil {
		return nil, err
	}
	if r.mark, err = encodeExprs(fi.proto, setMark(bit)); err != nil {
		return nil, err
	}
	return r, nil
}

// tmplKey is the shape of a balancing rule: everything but the group id.
type tmplKey struct {
	shard    uint32
	n        int
	affinity time.Duration
}

// tmpl is a balancing rule encoded with a placeholder group id, and where
// the id goes.
type tmpl struct {
	enc  [][]byte
	offs [][]int
}

// placeholder is the group id templates are encoded with. It never is a
// real group id: those are allocated from 2 upwards.
const placeholder = 0xfffffffe

// selectEnc returns the encoded balancing rules of group (see
// selectRules). Rules of one shape differ only in the group id, so they
// are encoded once per shape and patched.
func (r *renderer) selectEnc(group uint32, n int, t time.Duration) ([][]byte, error) {
	k := tmplKey{shard: shardOf(group), n: n, affinity: t}
	tp := r.templates[k]
	if tp == nil {
		rules := r.fi.selectRules(placeholder, k.shard, n, t)
		tp = &tmpl{}
		want := u32(placeholder)
		for _, ru := range rules {
			b, err := encodeExprs(r.fi.proto, ru)
			if err != nil {
				return nil, err
			}
			var offs []int
			for i := 0; i+4 <= len(b); i++ {
				if bytes.Equal(b[i:i+4], want) {
					offs = append(offs, i)
				}
			}
			tp.enc = append(tp.enc, b)
			tp.offs = append(tp.offs, offs)
		}
		r.templates[k] = tp
	}
	out := make([][]byte, len(tp.enc))
	id := u32(group)
	for i, b := range tp.enc {
		c := bytes.Clone(b)
		for _, off := range tp.offs[i] {
			copy(c[off:], id)
		}
		out[i] = c
	}
	return out, nil
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

// groupIDs returns the endpoint group ids of the service port with id id.
func groupIDs(id uint32) (internal, external uint32) { return id * 2, id*2 + 1 }

// service renders one service port with id id. prev is its previous
// rendering, or nil.
func (r *renderer) service(name model.ServicePortName, sp *model.ServicePort, t *proxier.Targets, id uint32, prev *svcObjs) (*svcObjs, error) {
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
	add := func(set string, e elem) { o.elems = append(o.elems, setElem{set: set, e: e}) }

	var clusterKey []byte
	if sp.ClusterIP.IsValid() {
		if !fi.fam.Contains(sp.ClusterIP) {
			return nil, fmt.Errorf("cluster IP %s is not %s", sp.ClusterIP, fi.fam)
		}
		if sp.Port == 0 {
			return nil, errors.New("port 0")
		}
		clusterKey = fi.ipKey(sp.ClusterIP, sp.Protocol, sp.Port)
		add(setClusterIPs, elem{key: fi.addr(sp.ClusterIP)})
	}
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
		if i >= len(sp.ExternalIPs) {
			lbKeys = append(lbKeys, k)
		}
	}
	var npKey []byte
	if sp.NodePort != 0 {
		npKey = portKey(sp.Protocol, sp.NodePort)
	}

	// Firewall: source ranges of load-balancer IPs, whatever the endpoints.
	if ranges := normalizeRanges(fi.fam, sp.LoadBalancerSourceRanges); len(sp.LoadBalancerSourceRanges) > 0 {
		for _, k := range lbKeys {
			add(setFirewallIPs, elem{key: k})
			for _, rg := range ranges {
				add(setFirewallAllow, elem{key: concat(k, fi.addr(rg[0])), keyEnd: concat(k, fi.addr(rg[1]))})
			}
		}
	}

	external := sp.ExternallyAccessible()
	if !t.HasEndpoints {
		reject := &verdict{code: unix.NFT_GOTO, chain: chainReject}
		noEndpoints(add, clusterKey, extKeys, npKey, reject)
		return o, nil
	}
	drop := &verdict{code: nfDrop}
	internal := r.endpoints(t.Internal)
	externalEps := r.endpoints(t.External)

	svc, ext := svcChain(name), extChain(name)
	gi, ge := groupIDs(id)
	var prevSlots [2][]netip.AddrPort
	if prev != nil {
		prevSlots = prev.slots
	}
	affinity := time.Duration(0)
	if sp.SessionAffinity {
		affinity = sp.AffinityTimeout.Truncate(time.Second)
		if affinity <= 0 {
			affinity = DefaultAffinityTimeout
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
	group := func(g uint32, which int, eps []netip.AddrPort) [][]byte {
		slots := stableSlots(prevSlots[which], eps)
		o.slots[which] = slots
		for i, ep := range slots {
			add(endpointsMap(shardOf(g)), elem{key: endpointKey(g, uint32(i)), val: fi.endpointVal(ep)})
			if affinity > 0 {
				add(setAffinityEndpoints, elem{key: concat(u32(g), fi.endpointVal(ep))})
			}
			add(setHairpin, elem{key: concat(fi.addr(ep.Addr()), fi.addr(ep.Addr()))})
		}
		rules, err := r.selectEnc(g, len(slots), affinity)
		if err != nil && encErr == nil {
			encErr = err
		}
		return rules
	}

	if len(internal) > 0 {
		c := chainObj{name: svc}
		if r.masqCluster {
			c.enc = append(c.enc, r.jumpMasq)
		}
		c.enc = append(c.enc, group(gi, 0, internal)...)
		o.chains = append(o.chains, c)
		if clusterKey != nil {
			add(setServiceIPs, elem{key: clusterKey, verdict: &verdict{code: unix.NFT_GOTO, chain: svc}})
		}
	} else if clusterKey != nil {
		add(setNoEndpointIPs, elem{key: clusterKey, verdict: drop})
	}

	if !external {
		return o, encErr
	}
	if len(externalEps) == 0 {
		noEndpoints(add, nil, extKeys, npKey, drop)
		return o, encErr
	}
	c := chainObj{name: ext}
	if sp.ExternalPolicy != model.PolicyLocal {
		c.enc = append(c.enc, r.mark)
		if len(internal) > 0 && sameEndpoints(internal, externalEps) {
			c.enc = append(c.enc, enc(rule{goTo(svc)}))
		} else {
			c.enc = append(c.enc, group(ge, 1, externalEps)...)
		}
	} else {
		if len(internal) > 0 {
			// Pods and the node itself reach a Local service's external
			// addresses through its cluster endpoints, masquerading the
			// node's own traffic (as kube-proxy does).
			if r.clusterCIDRs {
				c.enc = append(c.enc, enc(rule{fi.loadSaddr(reg(0)), lookup(setClusterCIDRs, reg(0), false), goTo(svc)}))
			}
			fromNode := append(fibLocal(true, expr.CmpOpEq), setMark(r.bit)...)
			c.enc = append(c.enc, enc(append(fromNode, goTo(svc))))
		}
		c.enc = append(c.enc, group(ge, 1, externalEps)...)
	}
	o.chains = append(o.chains, c)
	for _, k := range extKeys {
		add(setServiceIPs, elem{key: k, verdict: &verdict{code: unix.NFT_GOTO, chain: ext}})
	}
	if npKey != nil {
		add(setServiceNodePorts, elem{key: npKey, verdict: &verdict{code: unix.NFT_GOTO, chain: ext}})
	}
	return o, encErr
}

func noEndpoints(add func(string, elem), clusterKey []byte, extKeys [][]byte, npKey []byte, v *verdict) {
	if clusterKey != nil {
		add(setNoEndpointIPs, elem{key: clusterKey, verdict: v})
	}
	for _, k := range extKeys {
		add(setNoEndpointIPs, elem{key: k, verdict: v})
	}
	if npKey != nil {
		add(setNoEndpointPorts, elem{key: npKey, verdict: v})
	}
}

// endpoints returns the distinct usable endpoint addresses of eps.
func (r *renderer) endpoints(eps []*model.Endpoint) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		if ep == nil || !r.fi.fam.Contains(ep.Addr.Addr()) || ep.Addr.Port() == 0 {
			continue
		}
		a := netip.AddrPortFrom(ep.Addr.Addr().Unmap(), ep.Addr.Port())
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func sameEndpoints(a, b []netip.AddrPort) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// stableSlots orders eps so that endpoints keep the index they had in prev:
// a removed endpoint's index goes to the last one, new endpoints are
// appended. A one-endpoint change thus touches at most two indexes.
func stableSlots(prev, eps []netip.AddrPort) []netip.AddrPort {
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
		out = append(out, elem{key: fi.addr(rg[0])})
		if next := rg[1].Next(); next.IsValid() {
			out = append(out, elem{key: fi.addr(next), intervalEnd: true})
		}
	}
	return out
}

func concat(parts ...[]byte) []byte { return slices.Concat(parts...) }
