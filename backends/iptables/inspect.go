package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file reads the backend's chains back from the kernel (the
// flavour's *-save) and follows them as a packet would, for
// [proxier.Inspector]: each dispatch rule of the nat SERVICES and
// NODEPORTS chains is a frontend, walked once per kind of source (from
// outside, from each source range the walk meets, from the node itself)
// through the per-service chains to the DNATs each reaches; the filter
// rules that reject or drop what was not DNATed give the verdicts, the
// FW chains the load-balancer source ranges.

var _ proxier.Inspector = (*backend)(nil)

// Inspect implements [proxier.Inspector]: it reads the nat and filter
// tables back with the backend's *-save program and returns the
// frontends of the backend's chains.
func (b *backend) Inspect(ctx context.Context) ([]proxier.Frontend, error) {
	if b.run == nil {
		return nil, errors.New("iptables: backend is closed")
	}
	return readFrontends(ctx, b.run, b.r.n)
}

// Inspect reads what a proxier configured by cfg programmed in family,
// from the kernel and without a proxier: the frontends of the chains
// carrying cfg.ChainPrefix (default [DefaultChainPrefix]) in cfg.NetNS,
// in the flavour cfg.Mode names or, with [ModeAuto], the one that holds
// them (as [New] detects it). A namespace without our chains holds no
// frontend.
func Inspect(ctx context.Context, cfg Config, family model.IPFamily) ([]proxier.Frontend, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("iptables: unknown IP family %v", family)
	}
	cfg = cfg.WithDefaults()
	n, err := newNames(cfg.ChainPrefix)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	defer ns.Close()
	fl := iptables.Flavour(cfg.Mode)
	if cfg.Mode == ModeAuto {
		if fl, err = iptables.Detect(ctx, ns, cfg.ChainPrefix); err != nil {
			return nil, unsupported(err)
		}
	}
	tools, err := iptables.FindTools(family, fl)
	if err != nil {
		return nil, unsupported(err)
	}
	run, err := iptables.NewRunner(ctx, ns, tools, cfg.LockWait)
	if err != nil {
		return nil, unsupported(err)
	}
	return readFrontends(ctx, run, n)
}

// readFrontends saves every table (naming one would make the legacy
// kernel create it) and returns the frontends of n's chains.
func readFrontends(ctx context.Context, run *iptables.Runner, n names) ([]proxier.Frontend, error) {
	out, err := run.Save(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("iptables: inspect: %w", err)
	}
	return frontendsOf(parseRules(out, n), n), nil
}

// savedRules are the chains of one prefix in a *-save output (or a
// restore input), per table.
type savedRules [numTables]*chains

// chains are the chains of one table: their names and rules by index,
// the indexes by name.
type chains struct {
	idx   map[string]int
	names []string
	rules [][]xrule
}

// add returns the index of chain name, adding it when new.
func (c *chains) add(name string) int {
	i, ok := c.idx[name]
	if !ok {
		i = len(c.names)
		c.idx[name] = i
		c.names = append(c.names, name)
		c.rules = append(c.rules, nil)
	}
	return i
}

// of returns the rules of chain name, none when it does not exist.
func (c *chains) of(name string) []xrule {
	if i, ok := c.idx[name]; ok {
		return c.rules[i]
	}
	return nil
}

// xrule is one rule as the walk needs it.
type xrule struct {
	// src and dst are the -s and -d matches (invalid: none), negated
	// with srcNot and dstNot.
	src, dst       netip.Prefix
	srcNot, dstNot bool
	// srcLocal is "-m addrtype --src-type LOCAL", negated with
	// srcLocalNot.
	srcLocal, srcLocalNot bool
	proto                 string // -p, lower case; empty: any
	dport                 int    // --dport; -1: any
	// unsure is set by a match the walk cannot decide (chance, a
	// session-affinity record, marks, conntrack, ...): both ways are
	// followed.
	unsure bool
	// recent is set by -m recent (ClientIP session affinity).
	recent bool
	// target is the -j or -g target, goTo set for -g; dnat is DNAT's
	// --to-destination.
	target string
	goTo   bool
	dnat   netip.AddrPort
	// sub is the index of the target among the table's chains of the
	// prefix; -1 when it is not one of them.
	sub int
}

// parseRules returns the rules of n's chains in the nat and filter tables
// of a *-save output.
func parseRules(out []byte, n names) savedRules {
	var rs savedRules
	for t := range numTables {
		rs[t] = &chains{idx: map[string]int{}}
	}
	t := table(-1)
	cur, last := -1, "" // the chain of the last rule (a *-save lists a chain's rules together)
	var args []string   // reused
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			t, cur = table(slices.Index(tableNames[:], l[1:])), -1
		case t < 0:
		case strings.HasPrefix(l, ":"):
			// A chain, with or without rules.
			if chain, _, _ := strings.Cut(l[1:], " "); n.owns(chain) {
				rs[t].add(chain)
			}
		case strings.HasPrefix(l, "-A "):
			chain, rest, _ := strings.Cut(l[3:], " ")
			if cur < 0 || chain != last {
				if !n.owns(chain) {
					continue
				}
				cur, last = rs[t].add(chain), chain
			}
			var r xrule
			r, args = parseRule(rest, args[:0])
			rs[t].rules[cur] = append(rs[t].rules[cur], r)
		}
	}
	for _, c := range rs {
		for _, rules := range c.rules {
			for i := range rules {
				r := &rules[i]
				if j, ok := c.idx[r.target]; ok {
					r.sub = j
				}
			}
		}
	}
	return rs
}

// parseRule parses a rule's arguments (after "-A <chain> "), split into
// buf, which it returns for reuse. Options it does not know are skipped
// with their values; those of a match make it unsure.
func parseRule(args string, buf []string) (xrule, []string) {
	r := xrule{dport: -1, sub: -1}
	f := splitArgs(buf, args)
	module := ""
	for i := 0; i < len(f); i++ {
		neg := f[i] == "!"
		if neg && i+1 < len(f) {
			i++
		}
		opt, val := f[i], ""
		if i+1 < len(f) {
			val = f[i+1]
		}
		switch opt {
		case "-s", "--source", "-d", "--destination":
			p, err := parsePrefix(val)
			if err != nil {
				r.unsure = true
			} else if opt == "-s" || opt == "--source" {
				r.src, r.srcNot = p, neg
			} else {
				r.dst, r.dstNot = p, neg
			}
			i++
		case "-p", "--protocol":
			r.proto = strings.ToLower(val)
			r.unsure = r.unsure || neg
			i++
		case "--dport", "--destination-port":
			port, err := strconv.ParseUint(val, 10, 16)
			r.dport = int(port)
			r.unsure = r.unsure || neg || err != nil
			i++
		case "--comment":
			i++
		case "-m", "--match":
			module = val
			r.unsure = r.unsure || module == "statistic"
			r.recent = r.recent || module == "recent"
			i++
		case "--src-type":
			if val == "LOCAL" {
				r.srcLocal, r.srcLocalNot = true, neg
			} else {
				r.unsure = true
			}
			i++
		case "--rcheck", "--update":
			r.unsure = true
		case "-j", "--jump", "-g", "--goto":
			r.target, r.goTo = val, opt == "-g" || opt == "--goto"
			i++
		case "--to-destination":
			if ap, err := netip.ParseAddrPort(val); err == nil {
				r.dnat = ap
			}
			i++
		default:
			if r.target == "" && module != "comment" && module != "recent" && module != "statistic" {
				r.unsure = true
			}
			for i+1 < len(f) && !isOption(f[i+1]) {
				i++
			}
		}
	}
	return r, f
}

// isOption reports whether an argument starts an option (or negates one)
// rather than being a value.
func isOption(a string) bool { return a == "!" || strings.HasPrefix(a, "-") }

// splitArgs appends to out the rule arguments of s, split at spaces, a
// double-quoted argument (a comment) being one, unquoted.
func splitArgs(out []string, s string) []string {
	for s = strings.TrimLeft(s, " "); s != ""; s = strings.TrimLeft(s, " ") {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				end = len(s) - 1
			}
			out = append(out, s[1:1+end])
			s = s[min(len(s), end+2):]
			continue
		}
		a, rest, _ := strings.Cut(s, " ")
		out = append(out, a)
		s = rest
	}
	return out
}

// parsePrefix parses an address with or without a prefix length.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen()), err
}

// fkey is a frontend's address, protocol and port.
type fkey struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

// entryKey returns the frontend a dispatch or filter rule matches: a
// protocol, a port and one destination address or none (node ports).
func entryKey(r *xrule) (fkey, bool) {
	p := model.Protocol(strings.ToUpper(r.proto))
	if !p.Valid() || r.dport <= 0 || r.dstNot || r.srcNot || r.src.IsValid() || r.unsure {
		return fkey{}, false
	}
	k := fkey{proto: p, port: uint16(r.dport)}
	if r.dst.IsValid() {
		if !r.dst.IsSingleIP() {
			return fkey{}, false
		}
		k.addr = r.dst.Addr()
	}
	return k, true
}

// frontendsOf returns the frontends of rs: those the nat dispatch rules
// send to a chain of n, followed, merged with those the filter rules
// reject or drop.
func frontendsOf(rs savedRules, n names) []proxier.Frontend {
	idx := map[fkey]int{}
	var out []proxier.Frontend
	get := func(k fkey) (*proxier.Frontend, bool) {
		if i, ok := idx[k]; ok {
			return &out[i], false
		}
		idx[k] = len(out)
		out = append(out, proxier.Frontend{Addr: k.addr, Protocol: k.proto, Port: k.port})
		return &out[len(out)-1], true
	}
	w := &walker{nat: rs[tNAT], n: n}
	// fell are the frontends some sources leave without a DNAT.
	fell := map[fkey]bool{}
	for _, c := range []string{chServices, chNodePorts} {
		chain := n.fixed(c)
		rules := rs[tNAT].of(chain)
		for i := range rules {
			r := &rules[i]
			k, ok := entryKey(r)
			if !ok || r.sub < 0 {
				continue
			}
			f, isNew := get(k)
			if !isNew {
				continue // the first rule takes the packets
			}
			fl := flow{addr: k.addr, proto: r.proto, port: r.dport}
			fell[k] = w.frontend(f, r.sub, fl)
			f.Detail = "nat " + chain + " -> " + r.target
		}
	}
	for _, c := range []string{chServices, chExternal, chNodePorts} {
		chain := n.fixed(c)
		rules := rs[tFilter].of(chain)
		for i := range rules {
			r := &rules[i]
			k, ok := entryKey(r)
			if !ok || (r.target != "REJECT" && r.target != "DROP") {
				continue
			}
			f, isNew := get(k)
			if f.Verdict != "" {
				continue // an earlier rule decided
			}
			if isNew || fell[k] {
				f.Verdict = strings.ToLower(r.target)
			}
			f.Detail = strings.TrimPrefix(f.Detail+", ", ", ") + "filter " + chain + ": " + r.target
		}
	}
	return out
}

// flow is a new connection's destination: an address (invalid: a node
// address), a protocol and a port.
type flow struct {
	addr  netip.Addr
	proto string
	port  int
}

// source is a kind of source the walk distinguishes: an address in the
// prefixes some rule matched (invalid: outside all of them), and whether
// it is the node itself.
type source struct {
	addr  netip.Addr
	local bool
}

// path is where one source's connections may go.
type path struct {
	eps      []netip.AddrPort
	affinity bool
}

// walker follows packets through the nat chains.
type walker struct {
	nat *chains
	n   names
	// met are the sources the walk met conditions on, in order.
	met []source
}

// maxDepth bounds the chains a walk enters (ours nest 5 deep).
const maxDepth = 16

// frontend fills f's endpoints, affinity and source ranges by following
// fl from chain, once for each kind of source the rules tell apart; it
// reports whether some source reaches no DNAT.
func (w *walker) frontend(f *proxier.Frontend, chain int, fl flow) (fell bool) {
	if w.isFirewall(chain) {
		// The admitted ranges are the frontend's source ranges; the
		// walk goes on from the chain they lead to, as for every
		// source (other sources are dropped in filter).
		f.SourceRanges = []netip.Prefix{}
		next := -1
		for _, r := range w.nat.rules[chain] {
			if r.sub >= 0 && r.src.IsValid() && !r.srcNot {
				f.SourceRanges = append(f.SourceRanges, r.src)
				if next < 0 {
					next = r.sub
				}
			}
		}
		if next < 0 {
			return true
		}
		chain = next
	}
	w.met = append(w.met[:0], source{})
	var every, some []netip.AddrPort
	for i := 0; i < len(w.met); i++ {
		var p path
		if !w.chain(chain, fl, w.met[i], 0, &p) {
			fell = true
		}
		f.Affinity = f.Affinity || p.affinity
		slices.SortFunc(p.eps, netip.AddrPort.Compare)
		p.eps = slices.Compact(p.eps)
		if i == 0 {
			every = p.eps
		} else {
			every = sortedAnd(every, p.eps, true)
		}
		some = append(some, p.eps...)
	}
	if fell {
		every = nil // some sources reach none
	}
	slices.SortFunc(some, netip.AddrPort.Compare)
	f.Endpoints, f.SomeSources = every, sortedAnd(slices.Compact(some), every, false)
	return fell
}

// sortedAnd returns the elements of a that are in b (in) or are not (!in);
// a and b are sorted. It reuses a's array; it returns nil for none.
func sortedAnd(a, b []netip.AddrPort, in bool) []netip.AddrPort {
	out := a[:0]
	j := 0
	for _, x := range a {
		for j < len(b) && b[j].Compare(x) < 0 {
			j++
		}
		if (j < len(b) && b[j] == x) == in {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// isFirewall reports whether chain is a FW chain (load-balancer source
// ranges).
func (w *walker) isFirewall(chain int) bool {
	return strings.HasPrefix(w.nat.names[chain], w.n.prefix+"-"+kindFW+"-")
}

// chain follows the packet of fl from source s through chain, adding
// the DNATs it may reach to p. It reports whether the packet surely
// stopped (rather than going back to the chain that jumped here).
func (w *walker) chain(chain int, fl flow, s source, depth int, p *path) bool {
	if depth > maxDepth {
		return false
	}
	rules := w.nat.rules[chain]
	for i := range rules {
		r := &rules[i]
		ours := r.sub >= 0
		stops := r.target == "DNAT" || r.target == "ACCEPT" || r.target == "DROP" || r.target == "REJECT"
		if !ours && !stops && r.target != "RETURN" {
			continue // MARK and the like let the packet go on
		}
		w.meet(r)
		m := r.match(fl, s)
		if m == noMatch {
			continue
		}
		p.affinity = p.affinity || r.recent
		sure := m == matches
		switch {
		case ours:
			ended := w.chain(r.sub, fl, s, depth+1, p)
			if sure && (ended || r.goTo) {
				return ended
			}
		case r.target == "RETURN":
			if sure {
				return false
			}
		default:
			if r.dnat.IsValid() {
				p.eps = append(p.eps, r.dnat)
			}
			if sure {
				return true
			}
		}
	}
	return false
}

// meet records the kinds of sources a rule that decides the packet's
// path tells apart, for the walk to try each. (The rules that only mark
// packets, such as the SEP chains' hairpin rules, tell none apart.)
func (w *walker) meet(r *xrule) {
	add := func(s source) {
		if !slices.Contains(w.met, s) {
			w.met = append(w.met, s)
		}
	}
	if r.src.IsValid() {
		add(source{addr: r.src.Addr()})
	}
	if r.srcLocal {
		add(source{local: true})
	}
}

// matchResult is whether a rule matches a packet.
type matchResult int

const (
	noMatch matchResult = iota
	matches
	mayMatch // it depends on what the walk does not know
)

// match reports whether r matches the packet of fl from s.
func (r *xrule) match(fl flow, s source) matchResult {
	if r.proto != "" && r.proto != fl.proto || r.dport >= 0 && r.dport != fl.port {
		return noMatch
	}
	if r.dst.IsValid() && (fl.addr.IsValid() && r.dst.Contains(fl.addr)) == r.dstNot {
		return noMatch
	}
	if r.src.IsValid() && (s.addr.IsValid() && r.src.Contains(s.addr)) == r.srcNot {
		return noMatch
	}
	if r.srcLocal && s.local == r.srcLocalNot {
		return noMatch
	}
	if r.unsure {
		return mayMatch
	}
	return matches
}
