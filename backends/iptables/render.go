package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/proxykit/proxykit/model"
)

// This file renders one service port into iptables rules, per table.
// Rendering is pure: it reads the service port, its targets and the
// configuration, and touches nothing.

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
	// npSkipLoopback makes loopback destinations leave the node port
	// dispatch before npMatches (a configured range holds them but
	// localhost node ports are off).
	npSkipLoopback bool
	// localhost serves node ports on 127.0.0.1 (see
	// [Config.NoLocalhostNodePorts]).
	localhost bool
	loopback  string // "127.0.0.0/8" or "::1/128"
	// nodeIP is the node's primary address of the family, if known.
	nodeIP netip.Addr
	// The names of the fixed chains service ports write rules in.
	fServices, fExternal, fNodePorts, fFirewall, fMarkOutside string
}

func newRenderer(cfg Config, fam model.IPFamily, n names, randomFully bool) *renderer {
	r := &renderer{fam: fam, n: n, bit: fmt.Sprintf("%#x", cfg.MasqueradeBit), masqAll: cfg.MasqueradeAll,
		hostBits: "/32", randomFully: randomFully}
	r.markRule = "-j MARK --or-mark " + r.bit
	r.fServices, r.fExternal, r.fNodePorts = n.fixed(chServices), n.fixed(chExternal), n.fixed(chNodePorts)
	r.fFirewall, r.fMarkOutside = n.fixed(chFirewall), n.fixed(chMarkOutside)
	r.loopback = "127.0.0.0/8"
	if fam == model.IPv6 {
		r.hostBits, r.loopback = "/128", "::1/128"
	}
	for _, p := range cfg.ClusterCIDRs {
		if p.IsValid() && fam.Contains(p.Addr()) {
			r.cidrs = append(r.cidrs, unmapPrefix(p))
		}
	}
	r.localhost = localhostNodePorts(cfg, fam)
	r.nodeIP = cfg.NodeIP(fam)
	loopback := netip.MustParsePrefix(r.loopback)
	for _, p := range cfg.NodePortAddresses {
		if !p.IsValid() || !fam.Contains(p.Addr()) {
			continue
		}
		p = unmapPrefix(p)
		if p.Overlaps(loopback) && !r.localhost {
			// As kube-proxy: loopback addresses never open node ports
			// unless localhost node ports are on.
			if loopback.Bits() <= p.Bits() {
				continue
			}
			r.npSkipLoopback = true
		}
		r.npMatches = append(r.npMatches, "-d "+p.String()+" -m addrtype --dst-type LOCAL")
	}
	if len(r.npMatches) == 0 {
		// Every local address; loopback only with localhost node ports
		// (which need route_localnet, set by NewBackend).
		m := "-m addrtype --dst-type LOCAL"
		if !r.localhost {
			m = "! -d " + r.loopback + " " + m
		}
		r.npMatches = []string{m}
	}
	return r
}

// localhostNodePorts reports whether node ports open on 127.0.0.1 for
// fam: IPv4 only, unless turned off, and only when the node port
// addresses include loopback (none configured includes everything), as
// in kube-proxy.
func localhostNodePorts(cfg Config, fam model.IPFamily) bool {
	if fam != model.IPv4 || cfg.NoLocalhostNodePorts {
		return false
	}
	any4 := false
	for _, p := range cfg.NodePortAddresses {
		if p.IsValid() && fam.Contains(p.Addr()) {
			any4 = true
			if unmapPrefix(p).Contains(netip.AddrFrom4([4]byte{127, 0, 0, 0})) {
				return true
			}
		}
	}
	return !any4
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// comment quotes s as a rule comment.
func comment(s string) string {
	return string(append(appendCommentText([]byte(`-m comment --comment "`), 250, s), '"'))
}

// protoName returns the lower-case name of p, as iptables takes it.
func protoName(p model.Protocol) string {
	switch p {
	case model.TCP:
		return "tcp"
	case model.UDP:
		return "udp"
	case model.SCTP:
		return "sctp"
	}
	return strings.ToLower(string(p))
}

// rbuf collects the strings of one rendering in one buffer. String i is
// b[ends[i-1]:ends[i]]; every write to b belongs to the next string.
type rbuf struct {
	b      []byte
	ends   []int
	hashIn []byte
	// chains and shares are the rendering's chains and rules in fixed
	// chains, by string index.
	chains []pendingChain
	shares []pendingShared
}

// pendingChain is a chain whose name is string name and whose rules are
// strings [first, last).
type pendingChain struct{ name, first, last int }

// pendingShared is rule string rule in fixed chain chain of table t.
type pendingShared struct {
	t     table
	chain string
	rule  int
}

var rbufPool = sync.Pool{New: func() any { return &rbuf{b: make([]byte, 0, 8192)} }}

func getRbuf() *rbuf { return rbufPool.Get().(*rbuf) }

func putRbuf(w *rbuf) {
	if cap(w.b) > 1<<20 {
		return // a huge service port's: let it go
	}
	w.b, w.ends, w.chains, w.shares = w.b[:0], w.ends[:0], w.chains[:0], w.shares[:0]
	rbufPool.Put(w)
}

// end ends the string written since the last end and returns its index.
func (w *rbuf) end() int {
	w.ends = append(w.ends, len(w.b))
	return len(w.ends) - 1
}

// str writes parts as one string.
func (w *rbuf) str(parts ...string) int {
	for _, p := range parts {
		w.b = append(w.b, p...)
	}
	return w.end()
}

// bytes returns string i.
func (w *rbuf) bytes(i int) []byte {
	start := 0
	if i > 0 {
		start = w.ends[i-1]
	}
	return w.b[start:w.ends[i]]
}

// appendStr appends string i to b.
func (w *rbuf) appendStr(b []byte, i int) []byte { return append(b, w.bytes(i)...) }

// gotoChain ends the rule being written with "-g" and the chain named by
// string i. (See the comment on service for why goto.)
func (w *rbuf) gotoChain(i int) {
	w.b = append(w.b, "-g "...)
	w.b = w.appendStr(w.b, i)
	w.end()
}

// proto writes the protocol match.
func (w *rbuf) proto(proto string) {
	w.b = append(w.b, "-p "...)
	w.b = append(w.b, proto...)
	w.b = append(w.b, " -m "...)
	w.b = append(w.b, proto...)
}

// comment writes the comment match of the concatenation of parts and the
// space after it.
func (w *rbuf) comment(parts ...string) {
	w.b = append(w.b, `-m comment --comment "`...)
	w.b = appendCommentText(w.b, 250, parts...)
	w.b = append(w.b, `" `...)
}

// chain adds the chain named by string name whose rules are the strings
// from first on.
func (w *rbuf) chain(name, first int) {
	w.chains = append(w.chains, pendingChain{name: name, first: first, last: len(w.ends)})
}

// shared ends the rule being written with tail and adds it to chain of
// table t.
func (w *rbuf) shared(t table, chain string, tail ...string) {
	w.shares = append(w.shares, pendingShared{t: t, chain: chain, rule: w.str(tail...)})
}

// sharedJump ends the rule being written with verb (" -j " or " -g ")
// and the chain named by string target, and adds it to chain of table t.
func (w *rbuf) sharedJump(t table, chain, verb string, target int) {
	w.b = append(w.b, verb...)
	w.b = w.appendStr(w.b, target)
	w.shares = append(w.shares, pendingShared{t: t, chain: chain, rule: w.end()})
}

// rendering cuts the strings from one string and returns the rendering.
func (w *rbuf) rendering() rendering {
	all := string(w.b)
	strs := make([]string, len(w.ends))
	start := 0
	for i, e := range w.ends {
		strs[i] = all[start:e]
		start = e
	}
	trs := new([numTables]tableRules)
	if len(w.chains) > 0 {
		trs[tNAT].chains = make([]chainRules, len(w.chains))
		for i, c := range w.chains {
			// Capped: appending to one chain's rules never writes over
			// the next one's.
			trs[tNAT].chains[i] = chainRules{name: strs[c.name], rules: strs[c.first:c.last:c.last]}
		}
	}
	var n [numTables]int
	for _, s := range w.shares {
		n[s.t]++
	}
	for t := range numTables {
		if n[t] > 0 {
			trs[t].shared = make([]sharedRule, 0, n[t])
		}
	}
	for _, s := range w.shares {
		trs[s.t].shared = append(trs[s.t].shared, sharedRule{chain: s.chain, rule: strs[s.rule]})
	}
	return rendering{&trs[tNAT], &trs[tFilter]}
}

// appendCommentText appends the concatenation of parts as comment text:
// characters a quoted restore argument cannot hold become '_', and it
// stops after max characters.
func appendCommentText(b []byte, max int, parts ...string) []byte {
	n := 0
	for _, p := range parts {
		for _, r := range p {
			if n == max {
				return b
			}
			if r < ' ' || r > '~' || r == '"' || r == '\\' {
				r = '_'
			}
			b = append(b, byte(r))
			n++
		}
	}
	return b
}

// probability is the chance that a rule picks the first of n remaining
// endpoints, as kube-proxy writes it.
func probability(n int) string { return strconv.FormatFloat(1/float64(n), 'f', 10, 64) }

// endpoints returns the distinct usable endpoint addresses of eps.
func (r *renderer) endpoints(eps []*model.Endpoint) []netip.AddrPort {
	return model.DistinctAddrs(eps, r.fam.Usable)
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
		if r.npSkipLoopback {
			tail = append(tail, sharedRule{f(chServices), "-d " + r.loopback + " -j RETURN"})
		}
		for _, m := range r.npMatches {
			tail = append(tail, sharedRule{f(chServices), comment(strings.ToLower(r.n.prefix)+" service nodeports; must be the last rule in this chain") + " " + m + " -j " + f(chNodePorts)})
		}
	case tFilter:
		chains = []chainRules{
			{name: f(chServices)},
			{name: f(chExternal)},
			{name: f(chNodePorts)},
			{name: f(chFirewall), rules: r.firewallRules()},
			canary,
		}
		// As kube-proxy: the filter rules of node ports (reject without
		// endpoints, drop without local ones) hold on every local
		// address, whatever addresses node ports open on.
		tail = append(tail, sharedRule{f(chExternal), comment(strings.ToLower(r.n.prefix)+" service nodeports; must be the last rule in this chain") + " -m addrtype --dst-type LOCAL -j " + f(chNodePorts)})
	}
	return chains, tail
}

// firewallRules are the fixed rules of the filter FIREWALL chain. With
// localhost node ports, route_localnet lets packets to 127.0.0.0/8 come
// from other hosts; as in kube-proxy, those that were not DNATed by a
// node port rule (or belong to one) are dropped.
func (r *renderer) firewallRules() []string {
	if !r.localhost {
		return nil
	}
	return []string{comment("block incoming localnet connections") +
		" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"}
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
