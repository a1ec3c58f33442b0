package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/sandbox"
)

// iptablesPrefix starts the name of every chain of the iptables backend
// (its default ChainPrefix).
const iptablesPrefix = "PROXYKIT-"

// saveNAT returns the nat table of family (4 or 6) in node, as
// iptables-save prints it, from whichever flavour (nft or legacy) holds
// the backend's chains.
func saveNAT(ctx context.Context, node *sandbox.Node, family int) (tool, text string, err error) {
	pre := "iptables"
	if family == 6 {
		pre = "ip6tables"
	}
	err = fmt.Errorf("no %s-save found", pre)
	for _, t := range []string{pre + "-nft-save", pre + "-legacy-save", pre + "-save"} {
		if _, lerr := exec.LookPath(t); lerr != nil {
			continue
		}
		out, serr := node.Exec(ctx, t, "-t", "nat")
		if serr != nil {
			err = serr
			continue
		}
		if strings.Contains(out, ":"+iptablesPrefix) {
			return t, out, nil
		}
		err = nil
	}
	return "", "", err
}

// showIptables prints where the backend's nat rules send service traffic:
// the dispatch rules, and per service chain the endpoints its DNATs lead
// to.
func showIptables(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	for _, fam := range []int{4, 6} {
		tool, text, err := saveNAT(ctx, node, fam)
		if err != nil {
			return err
		}
		rules := parseSave(text)
		var dispatch []saveRule
		for _, r := range rules {
			if j := r.target(); (r.chain == iptablesPrefix+"SERVICES" || r.chain == iptablesPrefix+"NODEPORTS") &&
				strings.HasPrefix(j, iptablesPrefix) && j != iptablesPrefix+"NODEPORTS" {
				dispatch = append(dispatch, r)
			}
		}
		if len(dispatch) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nWhat iptables programmed in node1 (%s -t nat, chains %s*):\n", tool, iptablesPrefix)
		dnat := map[string][]string{} // chain -> its DNAT targets
		for _, r := range rules {
			if to := r.opt("--to-destination"); to != "" {
				dnat[r.chain] = append(dnat[r.chain], to)
			}
		}
		// endpoints follows a chain's jumps to endpoint (SEP) chains, also
		// through a balancing chain of external endpoints (XLB); gotos
		// lists its jumps to other service chains.
		var endpoints func(chain string, depth int) []string
		endpoints = func(chain string, depth int) []string {
			out := slices.Clone(dnat[chain])
			for _, r := range rules {
				j := r.target()
				if r.chain == chain && depth < 3 && (strings.HasPrefix(j, iptablesPrefix+"SEP-") || strings.HasPrefix(j, iptablesPrefix+"XLB-")) {
					out = append(out, endpoints(j, depth+1)...)
				}
			}
			slices.Sort(out)
			return slices.Compact(out)
		}
		gotos := func(chain string) []string {
			var out []string
			for _, r := range rules {
				j := r.target()
				if r.chain == chain && (strings.HasPrefix(j, iptablesPrefix+"SVC-") || strings.HasPrefix(j, iptablesPrefix+"EXT-") || strings.HasPrefix(j, iptablesPrefix+"FW-")) && !slices.Contains(out, j) {
					out = append(out, j)
				}
			}
			return out
		}
		named := func(eps []string) string {
			for i, ep := range eps {
				if ap, err := netip.ParseAddrPort(ep); err == nil {
					eps[i] = fmt.Sprintf("%s:%d", name(ap.Addr()), ap.Port())
				}
			}
			return strings.Join(eps, ", ")
		}
		slices.SortFunc(dispatch, func(a, b saveRule) int { return strings.Compare(a.opt("--comment"), b.opt("--comment")) })
		var chains []string
		for _, r := range dispatch {
			dst := strings.TrimSuffix(strings.TrimSuffix(r.opt("-d"), "/32"), "/128")
			if dst == "" {
				dst = "node"
			}
			fmt.Fprintf(w, "  %-34s %s %s:%s → %s\n", r.opt("--comment"), r.opt("-p"), dst, r.opt("--dport"), r.target())
			if c := r.target(); !slices.Contains(chains, c) {
				chains = append(chains, c)
			}
		}
		fmt.Fprintln(w, "  service chains (where each one DNATs to):")
		for i := 0; i < len(chains); i++ {
			c := chains[i]
			var parts []string
			if eps := endpoints(c, 0); len(eps) > 0 {
				parts = append(parts, "→ "+named(eps))
			}
			if g := gotos(c); len(g) > 0 {
				s := "goto " + strings.Join(g, ", ")
				if len(parts) > 0 {
					s = "(some sources: " + s + ")"
				}
				parts = append(parts, s)
				for _, x := range g {
					if !slices.Contains(chains, x) {
						chains = append(chains, x)
					}
				}
			}
			fmt.Fprintf(w, "    %-30s %s\n", c, strings.Join(parts, " "))
		}
		n := 0
		for _, r := range rules {
			if strings.HasPrefix(r.chain, iptablesPrefix) {
				n++
			}
		}
		fmt.Fprintf(w, "  %d rules in %s chains of the nat table; the filter table holds the rejects\n", n, iptablesPrefix+"*")
	}
	return nil
}

// rawIptables prints the backend's chains of iptables-save.
func rawIptables(ctx context.Context, w io.Writer, node *sandbox.Node, _ func(netip.Addr) string) error {
	for _, fam := range []int{4, 6} {
		tool, text, err := saveNAT(ctx, node, fam)
		if err != nil {
			return err
		}
		if text == "" {
			continue
		}
		fmt.Fprintf(w, "\nWhat iptables programmed in node1 (`%s -t nat`, lines of %s chains):\n", tool, iptablesPrefix+"*")
		sc := bufio.NewScanner(strings.NewReader(text))
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, iptablesPrefix) {
				fmt.Fprintln(w, "  "+l)
			}
		}
	}
	return nil
}

// saveRule is one "-A CHAIN ..." line of iptables-save.
type saveRule struct {
	chain string
	args  []string
}

// target returns the chain or target the rule jumps (-j) or goes (-g) to.
func (r saveRule) target() string {
	if t := r.opt("-g"); t != "" {
		return t
	}
	return r.opt("-j")
}

// opt returns the value after the last occurrence of flag.
func (r saveRule) opt(flag string) string {
	v := ""
	for i, a := range r.args {
		if a == flag && i+1 < len(r.args) {
			v = r.args[i+1]
		}
	}
	return v
}

func parseSave(text string) []saveRule {
	var out []saveRule
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := splitQuoted(sc.Text())
		if len(f) >= 2 && f[0] == "-A" {
			out = append(out, saveRule{chain: f[1], args: f[2:]})
		}
	}
	return out
}

// splitQuoted splits a line at spaces, keeping "quoted strings" whole.
func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, has := false, false
	for _, c := range s {
		switch {
		case c == '"':
			quoted, has = !quoted, true
		case c == ' ' && !quoted:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteRune(c)
			has = true
		}
	}
	if has {
		out = append(out, cur.String())
	}
	return out
}
