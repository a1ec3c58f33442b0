package iptables

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/model"
)

// A complete rewrite records what it wrote: the nat chain
// <prefix>-FINGERPRINT holds one rule without target whose comment is 32
// hex digits of the SHA-256 of every rule the rewrite leaves in our
// chains (the fixed chains, the jumps from the built-in chains, and each
// service port's chains and rules in the fixed chains), written in the
// rewrite's last commit (the nat section of its last restore run, after
// the filter one). The rewrite's first commit, before any chain of ours
// changes, flushes the fingerprint chain when the kernel may hold the
// rule: a process killed between two commits leaves no fingerprint,
// rather than one that describes other rules than the tables hold (the
// new rules in nat over the old filter ones, or the old fingerprint over
// chains partly rewritten), which the next process would adopt when the
// set of chains is the same. The first sync of a process adopts what it
// finds instead of rewriting it when the fingerprint is the one of what
// it would write, the per-service chains are exactly those it would
// write, and the jumps check out: nothing is restored. The nft flavour
// checks the chains after the sync (verify.go).
//
// What is trusted: that nobody changed the rules of our chains without
// changing the set of our chains or the fingerprint rule. The periodic
// rewrite ([Config.RewriteInterval]) writes everything regardless. A
// partial sync that changes anything flushes the fingerprint chain in its
// own run, so a process started after it rewrites.

// fingerprint returns the comment of the fingerprint rule of a table
// set that holds the fixed chains and want.
func (b *backend) fingerprint(want [numTables]map[model.ServicePortName]*tableRules) string {
	h := sha256.New()
	// The lines go through a buffer: a Write per part converted each
	// string (half of the hashing's time at 30,000 services).
	buf := make([]byte, 0, 64<<10)
	line := func(parts ...string) {
		for _, p := range parts {
			buf = append(buf, p...)
		}
		buf = append(buf, '\n')
		if len(buf) >= 60<<10 {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	for t := range numTables {
		line("*", t.String())
		fixed, tail := b.r.fixedChains(t)
		for _, c := range fixed {
			line(":", c.name)
			for _, r := range c.rules {
				line("-A ", c.name, " ", r)
			}
		}
		for _, s := range tail {
			line("-A ", s.chain, " ", s.rule)
		}
		for _, j := range b.r.jumps() {
			if j.table == t {
				line("-J ", j.chain, " ", restoreArgs(j.rule))
			}
		}
		for _, n := range slices.SortedFunc(maps.Keys(want[t]), model.ServicePortName.Compare) {
			tr := want[t][n]
			line("#", n.String())
			for _, c := range tr.chains {
				line(":", c.name)
				for _, r := range c.rules {
					line("-A ", c.name, " ", r)
				}
			}
			for _, s := range tr.shared {
				line("-A ", s.chain, " ", s.rule)
			}
		}
	}
	h.Write(buf)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// writeFingerprint writes the fingerprint chain, holding the rule of fp,
// to in's nat section.
func (b *backend) writeFingerprint(in *input, fp string) {
	c := b.r.n.fixed(chFingerprint)
	in.declare(c)
	in.appendRule(c, "-m comment --comment "+fp)
}

// savedFingerprint returns the comment of the fingerprint rule in a line
// of nat's *-save output, if it is that rule.
func (b *backend) savedFingerprint(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "-A "+b.r.n.fixed(chFingerprint)+" -m comment --comment ")
	if !ok {
		return "", false
	}
	return strings.Trim(rest, `"`), true
}
