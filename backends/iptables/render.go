package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file renders one service port into iptables rules, per table.
// Rendering is pure: it reads the service port, its targets and the
// configuration, and touches nothing.

// DefaultAffinityTimeout is the session affinity timeout used when a
// service asks for affinity without one (Kubernetes' default).
const DefaultAffinityTimeout = 10800 * time.Second

// chainRules is a chain owned by one service port and its rules, each
// the arguments after "-A <chain> ".
type chainRules struct {
	name  string
	rules []string
}

func (c *chainRules) equal(o *chainRules) bool {
	return c.name == o.name && slices.Equal(c.rules, o.rules)
}

// sharedRule is a rule of one service port in a fixed chain.
type sharedRule struct {
	chain string
	rule  string
}

// tableRules is what one service port holds in one table.
type tableRules struct {
	chains []chainRules
	shared []sharedRule
}

func (t *tableRules) empty() bool { return t == nil || len(t.chains) == 0 && len(t.shared) == 0 }

// rendering is what one service port holds in each table; nil: nothing.
type rendering [numTables]*tableRules

// renderer renders service ports for one family and configuration.
type renderer struct {
	fam model.IPFamily
	n   names
	bit string // the masquerade bit, "0x4000"
	// markRule sets the masquerade bit. It is written inline rather than
	// as a jump to a chain (kube-proxy's KUBE-MARK-MASQ): nf_tables
	// validates every jump again on each commit.
	markRule    string
	masqAll     bool
	cidrs       []netip.Prefix // the family's cluster CIDRs
	hostBits    string         // "/32" or "/128"
	randomFully bool
	// npMatches select the node addresses node ports open on; one
	// jump to the NODEPORTS chains each.
	npMatches []string
	// badRule, set by tests only, adds an invalid rule to a service
	// port's SVC chain.
	badRule func(model.ServicePortName) string
}

func newRenderer(cfg Config, fam model.IPFamily, n names, randomFully bool) *renderer {
	r := &renderer{fam: fam, n: n, bit: fmt.Sprintf("%#x", cfg.MasqueradeBit), masqAll: cfg.MasqueradeAll,
		hostBits: "/32", randomFully: randomFully}
	r.markRule = "-j MARK --or-mark " + r.bit
	loopback := "127.0.0.0/8"
	if fam == model.IPv6 {
		r.hostBits, loopback = "/128", "::1/128"
	}
	for _, p := range cfg.ClusterCIDRs {
		if p.IsValid() && fam.Contains(p.Addr()) {
			r.cidrs = append(r.cidrs, unmapPrefix(p))
		}
	}
	for _, p := range cfg.NodePortAddresses {
		if p.IsValid() && fam.Contains(p.Addr()) {
			r.npMatches = append(r.npMatches, "-d "+unmapPrefix(p).String()+" -m addrtype --dst-type LOCAL")
		}
	}
	if len(r.npMatches) == 0 {
		// Every local address but loopback: a node port on 127.0.0.1
		// would need route_localnet, which the backend does not set.
		r.npMatches = []string{"! -d " + loopback + " -m addrtype --dst-type LOCAL"}
	}
	return r
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// comment quotes s as a rule comment.
func comment(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' || r == '"' || r == '\\' {
			return '_'
		}
		return r
	}, s)
	if len(s) > 250 {
		s = s[:250]
	}
	return `-m comment --comment "` + s + `"`
}

// service renders one service port.
func (r *renderer) service(name model.ServicePortName, sp *model.ServicePort, t *proxier.Targets) (rendering, error) {
	var rd rendering
	if !sp.Protocol.Valid() {
		return rd, fmt.Errorf("unsupported protocol %q", sp.Protocol)
	}
	if t == nil {
		t = &proxier.Targets{}
	}
	proto := strings.ToLower(string(sp.Protocol))
	pm := "-p " + proto + " -m " + proto
	svcName := name.String()
	dst := func(a netip.Addr, port uint16) string {
		return "-d " + a.Unmap().String() + r.hostBits + " " + pm + " --dport " + strconv.Itoa(int(port))
	}

	var clusterDst string
	if sp.ClusterIP.IsValid() {
		if !r.fam.Contains(sp.ClusterIP) {
			return rd, fmt.Errorf("cluster IP %s is not %s", sp.ClusterIP, r.fam)
		}
		if sp.Port == 0 {
			return rd, errors.New("port 0")
		}
		clusterDst = dst(sp.ClusterIP, sp.Port)
	}
	var extDsts, lbDsts []string
	for i, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if !r.fam.Contains(a) {
			return rd, fmt.Errorf("address %s is not %s", a, r.fam)
		}
		if sp.Port == 0 {
			return rd, errors.New("port 0")
		}
		d := dst(a, sp.Port)
		if slices.Contains(extDsts, d) || slices.Contains(lbDsts, d) {
			continue
		}
		if i < len(sp.ExternalIPs) {
			extDsts = append(extDsts, d)
		} else {
			lbDsts = append(lbDsts, d)
		}
	}
	var npMatch string
	if sp.NodePort != 0 {
		npMatch = pm + " --dport " + strconv.Itoa(int(sp.NodePort))
	}

	nat, filter := &tableRules{}, &tableRules{}
	rd[tNAT], rd[tFilter] = nat, filter
	natShared := func(chain, rule string) {
		nat.shared = append(nat.shared, sharedRule{r.n.fixed(chain), rule})
	}
	filterShared := func(chain, rule string) {
		filter.shared = append(filter.shared, sharedRule{r.n.fixed(chain), rule})
	}
	// filterAll rejects or drops every address of the port in filter.
	filterAll := func(cluster bool, why, verdict string) {
		c := comment(svcName + " " + why)
		if cluster && clusterDst != "" {
			filterShared(chServices, c+" "+clusterDst+" -j "+verdict)
		}
		if cluster {
			return
		}
		for _, d := range slices.Concat(extDsts, lbDsts) {
			filterShared(chExternal, c+" "+d+" -j "+verdict)
		}
		if npMatch != "" {
			filterShared(chNodePorts, c+" "+npMatch+" -j "+verdict)
		}
	}

	external := sp.ExternallyAccessible()
	if !t.HasEndpoints {
		filterAll(true, "has no endpoints", "REJECT")
		if external {
			filterAll(false, "has no endpoints", "REJECT")
		}
		return rd, nil
	}

	internal, externalEps := r.endpoints(t.Internal), r.endpoints(t.External)
	affinity := 0
	if sp.SessionAffinity {
		affinity = int(sp.AffinityTimeout / time.Second)
		if affinity <= 0 {
			affinity = int(DefaultAffinityTimeout / time.Second)
		}
	}
	// Endpoint chains, shared by the balancing chains.
	seps := map[netip.AddrPort]string{}
	for _, ep := range slices.Concat(internal, externalEps) {
		if _, ok := seps[ep]; ok {
			continue
		}
		sep := r.n.sep(name, ep.String())
		seps[ep] = sep
		dnat := "-p " + proto
		if affinity > 0 {
			dnat += " -m recent --name " + sep + " --set"
		}
		nat.chains = append(nat.chains, chainRules{name: sep, rules: []string{
			"-s " + ep.Addr().String() + r.hostBits + " " + r.markRule,
			dnat + " -j DNAT --to-destination " + ep.String(),
		}})
	}
	balance := func(chain string, eps []netip.AddrPort, first ...string) chainRules {
		c := chainRules{name: chain, rules: first}
		if affinity > 0 {
			secs := strconv.Itoa(affinity)
			for _, ep := range eps {
				c.rules = append(c.rules, "-m recent --name "+seps[ep]+" --rcheck --seconds "+secs+" --reap -j "+seps[ep])
			}
		}
		for i, ep := range eps {
			if i < len(eps)-1 {
				c.rules = append(c.rules, "-m statistic --mode random --probability "+probability(len(eps)-i)+" -j "+seps[ep])
			} else {
				c.rules = append(c.rules, "-j "+seps[ep])
			}
		}
		return c
	}

	h := r.n.serviceHash(name)
	svc := r.n.chain(kindSVC, h)
	hasSVC := clusterDst != "" && len(internal) > 0
	if hasSVC {
		var masq []string
		switch {
		case r.masqAll:
			masq = []string{r.markRule}
		case len(r.cidrs) == 1:
			masq = []string{"! -s " + r.cidrs[0].String() + " " + r.markRule}
		case len(r.cidrs) > 1:
			masq = []string{"-j " + r.n.fixed(chMarkOutside)}
		}
		c := balance(svc, internal, masq...)
		if r.badRule != nil {
			if bad := r.badRule(name); bad != "" {
				c.rules = append(c.rules, bad)
			}
		}
		nat.chains = append(nat.chains, c)
		natShared(chServices, comment(svcName+" cluster IP")+" "+clusterDst+" -j "+svc)
	} else if clusterDst != "" {
		filterAll(true, "has no local endpoints", "DROP")
	}

	if !external {
		return rd, nil
	}
	if len(externalEps) == 0 {
		filterAll(false, "has no local endpoints", "DROP")
		return rd, nil
	}
	ext, xlb := r.n.chain(kindEXT, h), r.n.chain(kindXLB, h)
	extChain := chainRules{name: ext}
	useXLB := true
	if sp.ExternalPolicy != model.PolicyLocal {
		extChain.rules = append(extChain.rules, r.markRule)
		if hasSVC && sameEndpoints(internal, externalEps) {
			extChain.rules = append(extChain.rules, "-j "+svc)
			useXLB = false
		}
	} else if hasSVC {
		// Pods and the node itself reach a Local service's external
		// addresses through its cluster endpoints; the node's own
		// traffic is masqueraded (as kube-proxy does).
		for _, p := range r.cidrs {
			extChain.rules = append(extChain.rules, "-s "+p.String()+" -j "+svc)
		}
		extChain.rules = append(extChain.rules,
			"-m addrtype --src-type LOCAL "+r.markRule,
			"-m addrtype --src-type LOCAL -j "+svc)
	}
	if useXLB {
		extChain.rules = append(extChain.rules, "-j "+xlb)
	}
	nat.chains = append(nat.chains, extChain)
	if useXLB {
		nat.chains = append(nat.chains, balance(xlb, externalEps))
	}
	for _, d := range extDsts {
		natShared(chServices, comment(svcName+" external IP")+" "+d+" -j "+ext)
	}
	if len(lbDsts) > 0 && len(sp.LoadBalancerSourceRanges) > 0 {
		fw := r.n.chain(kindFW, h)
		fwChain := chainRules{name: fw}
		for _, p := range sp.LoadBalancerSourceRanges {
			if p.IsValid() && r.fam.Contains(p.Addr()) {
				fwChain.rules = append(fwChain.rules, "-s "+unmapPrefix(p).String()+" -j "+ext)
			}
		}
		// The node's own traffic passes (it is not what source ranges
		// are about); the rest falls through undNATed and is dropped
		// by the filter FIREWALL chain.
		fwChain.rules = append(fwChain.rules, "-m addrtype --src-type LOCAL -j "+ext)
		nat.chains = append(nat.chains, fwChain)
		for _, d := range lbDsts {
			natShared(chServices, comment(svcName+" loadbalancer IP")+" "+d+" -j "+fw)
			filterShared(chFirewall, comment(svcName+" traffic not accepted by "+fw)+" "+d+" -j DROP")
		}
	} else {
		for _, d := range lbDsts {
			natShared(chServices, comment(svcName+" loadbalancer IP")+" "+d+" -j "+ext)
		}
	}
	if npMatch != "" {
		natShared(chNodePorts, comment(svcName)+" "+npMatch+" -j "+ext)
	}
	return rd, nil
}

// probability is the chance that a rule picks the first of n remaining
// endpoints, as kube-proxy writes it.
func probability(n int) string { return strconv.FormatFloat(1/float64(n), 'f', 10, 64) }

// endpoints returns the distinct usable endpoint addresses of eps.
func (r *renderer) endpoints(eps []*model.Endpoint) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		if ep == nil || !r.fam.Contains(ep.Addr.Addr()) || ep.Addr.Port() == 0 {
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

// fixedChains returns the fixed chains of table t with their rules, in
// the order they are written. Rules of service ports go before the rules
// returned in tail, which must stay last in their chains.
func (r *renderer) fixedChains(t table) (chains []chainRules, tail []sharedRule) {
	f := r.n.fixed
	canary := chainRules{name: f(chCanary), rules: []string{canaryRule}}
	switch t {
	case tNAT:
		masq := "-j MASQUERADE"
		if r.randomFully {
			masq += " --random-fully"
		}
		chains = []chainRules{
			{name: f(chServices)},
			{name: f(chNodePorts)},
			{name: f(chPostrouting), rules: []string{
				"-m mark ! --mark " + r.bit + "/" + r.bit + " -j RETURN",
				// Clear the bit: a packet that goes through the stack
				// again (e.g. encapsulated) is not masqueraded twice.
				"-j MARK --xor-mark " + r.bit,
				comment(strings.ToLower(r.n.prefix)+" service traffic requiring SNAT") + " " + masq,
			}},
		}
		if !r.masqAll && len(r.cidrs) > 1 {
			c := chainRules{name: f(chMarkOutside)}
			for _, p := range r.cidrs {
				c.rules = append(c.rules, "-s "+p.String()+" -j RETURN")
			}
			c.rules = append(c.rules, r.markRule)
			chains = append(chains, c)
		}
		chains = append(chains, canary)
		for _, m := range r.npMatches {
			tail = append(tail, sharedRule{f(chServices), comment(strings.ToLower(r.n.prefix)+" service nodeports; must be the last rule in this chain") + " " + m + " -j " + f(chNodePorts)})
		}
	case tFilter:
		chains = []chainRules{
			{name: f(chServices)},
			{name: f(chExternal)},
			{name: f(chNodePorts)},
			{name: f(chFirewall)},
			canary,
		}
		for _, m := range r.npMatches {
			tail = append(tail, sharedRule{f(chExternal), comment(strings.ToLower(r.n.prefix)+" service nodeports; must be the last rule in this chain") + " " + m + " -j " + f(chNodePorts)})
		}
	}
	return chains, tail
}

// sharedTarget reports whether per-service chains jump to the fixed chain
// name, which must therefore exist before them.
func (r *renderer) sharedTarget(name string) bool { return name == r.n.fixed(chMarkOutside) }

// canaryRule is the one rule of the canary chains. A partial sync deletes
// and re-adds it first thing in each table: when the chain or the rule is
// gone (someone flushed the table), that line fails and the backend
// resyncs everything.
const canaryRule = "-j RETURN"

// jump is a rule in a built-in chain that sends packets to ours.
type jump struct {
	table table
	chain string
	rule  []string
}

// restoreArgs writes rule arguments as a restore input does, quoting
// those with spaces.
func restoreArgs(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if strings.ContainsAny(a, " \t") {
			b.WriteString(`"` + a + `"`)
		} else {
			b.WriteString(a)
		}
	}
	return b.String()
}

// jumps returns the rules the backend keeps in the built-in chains.
func (r *renderer) jumps() []jump {
	p := strings.ToLower(r.n.prefix)
	f := r.n.fixed
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	to := func(cmt, chain string, ct bool) []string {
		var rule []string
		if ct {
			rule = append(rule, ctNew...)
		}
		return append(rule, "-m", "comment", "--comment", p+" "+cmt, "-j", f(chain))
	}
	portals := to("service portals", chServices, false)
	return []jump{
		{tNAT, "PREROUTING", portals},
		{tNAT, "OUTPUT", portals},
		{tNAT, "POSTROUTING", to("postrouting rules", chPostrouting, false)},
		{tFilter, "INPUT", to("load balancer firewall", chFirewall, true)},
		{tFilter, "INPUT", to("externally-visible service portals", chExternal, true)},
		{tFilter, "FORWARD", to("load balancer firewall", chFirewall, true)},
		{tFilter, "FORWARD", to("service portals", chServices, true)},
		{tFilter, "FORWARD", to("externally-visible service portals", chExternal, true)},
		{tFilter, "OUTPUT", to("load balancer firewall", chFirewall, true)},
		{tFilter, "OUTPUT", to("service portals", chServices, true)},
	}
}
