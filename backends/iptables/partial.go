package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file writes the difference between the state kept in memory and
// the desired one: partial syncs and the periodic full request.

// syncPartial rewrites what changed for the service ports req names,
// computed from the state in memory.
func (b *backend) syncPartial(ctx context.Context, req *proxier.SyncRequest, names map[model.ServicePortName]struct{}) error {
	start := time.Now()
	errs := map[model.ServicePortName]error{}
	// orig is what the kernel held for the ports at the start; want is
	// what it should hold (nil: nothing).
	var orig, want [numTables]map[model.ServicePortName]*tableRules
	for t := range numTables {
		orig[t] = make(map[model.ServicePortName]*tableRules, len(names))
		want[t] = make(map[model.ServicePortName]*tableRules, len(names))
	}
	for name := range names {
		rd, ok := b.render(req, name, errs)
		if !ok {
			rd = b.st.rendering(name)
		}
		for t := range numTables {
			orig[t][name] = b.st.svcs[t][name]
			want[t][name] = rd[t]
		}
	}
	// A full request checks the jumps from the built-in chains: in the
	// restore run (-C) in the legacy flavour, which reads the whole
	// table for the run anyway; before it in the nft one, with iptables
	// -S of the built-in chains (jumpsListed), as a restart does:
	// iptables-nft's -C also fetches every rule of the chain jumped to,
	// our dispatch chain of a rule per service port (0.26-0.45 s at
	// 30,000 services), where -S reads only the chain it names. A jump
	// missing or printed otherwise than rendered is checked again, and
	// put back when missing, by ensureJumps (-C and -I), as a failed -C
	// line would be.
	checkJumps := req.Full
	if req.Full && b.run != nil && b.run.Tools().Flavour == iptables.NFT {
		checkJumps = false
		ok, err := b.jumpsListed(ctx, nil)
		if err == nil && !ok {
			err = b.ensureJumps(ctx)
		}
		if err != nil {
			b.st = nil
			return fmt.Errorf("iptables: partial sync: %w", err)
		}
	}
	jumpsFixed := false
	for attempt := 0; ; attempt++ {
		in := b.partialInput(want, req.Full, checkJumps)
		b.last = inputStats{sections: 1, lines: in.lines, bytes: len(in.b)}
		if in.lines == 0 {
			b.commit(want, numTables)
			break
		}
		err := b.restore(ctx, in.b)
		if err == nil {
			b.commit(want, numTables)
			if in.unprints {
				b.st.fingerprint = ""
			}
			b.last.rules = countRules(in.b)
			break
		}
		var re *iptables.RestoreError
		if !errors.As(err, &re) || re.Line == 0 {
			b.st = nil
			return fmt.Errorf("iptables: partial sync: %w", err)
		}
		for t := range numTables {
			if in.committedBefore(t, re.Line) {
				b.commit(want, t+1)
				if in.unprints && t == tNAT {
					b.st.fingerprint = ""
				}
			}
		}
		sp, ok := in.lookup(re.Line)
		switch {
		case ok && sp.kind == spanCanary:
			return errDrift
		case ok && sp.kind == spanJump && !jumpsFixed:
			b.log.Warn("a jump from a built-in chain is missing", "rule", re.Text)
			if err := b.ensureJumps(ctx); err != nil {
				b.st = nil
				return fmt.Errorf("iptables: %w", err)
			}
			jumpsFixed = true
			continue
		case strings.HasPrefix(re.Text, "-D ") || strings.HasPrefix(re.Text, "-X "):
			// A rule or chain of ours is not as we left it: the
			// kernel no longer matches the state in memory.
			b.log.Warn("our rules were changed behind our back", "line", re.Line, "err", re.Msg)
			return errDrift
		case ok && sp.kind == spanService && attempt < maxRetries:
			b.log.Warn("restore refused a service port's rules; keeping its previous rules", "service", sp.svc.String(),
				"line", re.Line, "err", re.Msg)
			errs[sp.svc] = refused(re)
			for t := range numTables {
				want[t][sp.svc] = orig[t][sp.svc]
			}
			continue
		}
		b.st = nil
		return fmt.Errorf("iptables: partial sync: %w", err)
	}
	b.log.Debug("partial sync", "full", req.Full, "services", len(names), "lines", b.last.lines, "duration", time.Since(start))
	return proxier.JoinObjectErrors(errs)
}

// commit records that the tables before end hold want.
func (b *backend) commit(want [numTables]map[model.ServicePortName]*tableRules, end table) {
	for t := range end {
		for n, tr := range want[t] {
			if tr.empty() {
				delete(b.st.svcs[t], n)
			} else {
				b.st.svcs[t][n] = tr
			}
		}
	}
}

// partialInput writes the restore input that turns b.st into want for the
// service ports want names. Each table section starts with the canary
// check; a table without changes is left out unless always is set (the
// legacy flavour reads and writes a whole table for each section). With
// checkJumps set, each section also checks the jumps from the built-in
// chains (-C).
func (b *backend) partialInput(want [numTables]map[model.ServicePortName]*tableRules, always, checkJumps bool) *input {
	in := newInput(4096)
	canary := b.r.n.fixed(chCanary)
	var names [numTables][]model.ServicePortName
	var diffs [numTables][]tableDiff
	var changed [numTables]bool
	for t := range numTables {
		names[t] = slices.SortedFunc(maps.Keys(want[t]), model.ServicePortName.Compare)
		diffs[t] = make([]tableDiff, len(names[t]))
		for i, n := range names[t] {
			diffs[t][i] = diffTable(b.st.svcs[t][n], want[t][n])
			changed[t] = changed[t] || !diffs[t][i].empty()
		}
	}
	// A change makes the fingerprint of the last rewrite untrue: its
	// chain is flushed in the same run.
	unprint := b.st.fingerprint != "" && (changed[tNAT] || changed[tFilter])
	for t := range numTables {
		names, diffs := names[t], diffs[t]
		if !changed[t] && !always && !(unprint && t == tNAT) {
			continue
		}
		in.begin(t)
		in.mark(spanCanary, nil)
		in.line("-D ", canary, " ", canaryRule)
		in.appendRule(canary, canaryRule)
		if unprint && t == tNAT {
			in.fixed()
			in.declare(b.r.n.fixed(chFingerprint))
			in.unprints = true
		}
		if checkJumps {
			// The jumps from the built-in chains, checked in the same
			// run rather than one iptables -C each (the legacy flavour
			// reads the whole table for each).
			in.mark(spanJump, nil)
			for _, j := range b.r.jumps() {
				if j.table == t {
					in.line("-C ", j.chain, " ", restoreArgs(j.rule))
				}
			}
		}
		// Declarations first (creating or flushing), then the rules of
		// the fixed chains (removed before added), then the new chain
		// contents, then the deletion of chains nothing refers to any
		// more.
		for i := range names {
			in.mark(spanService, &names[i])
			for _, c := range diffs[i].write {
				in.declare(c.name)
			}
			for _, c := range diffs[i].del {
				in.declare(c.name)
			}
		}
		for i := range names {
			in.mark(spanService, &names[i])
			for _, s := range diffs[i].unshare {
				in.line("-D ", s.chain, " ", s.rule)
			}
		}
		for i := range names {
			in.mark(spanService, &names[i])
			for _, s := range diffs[i].share {
				// At the top: the node port jump stays last.
				in.line("-I ", s.chain, " 1 ", s.rule)
			}
			for _, c := range diffs[i].write {
				for _, r := range c.rules {
					in.appendRule(c.name, r)
				}
			}
		}
		for i := range names {
			in.mark(spanService, &names[i])
			for _, c := range diffs[i].del {
				in.line("-X ", c.name)
			}
		}
		in.commit()
	}
	return in
}

// tableDiff is what a partial sync changes of one service port in one
// table.
type tableDiff struct {
	write, del     []*chainRules // chains to (re)write, chains to delete
	unshare, share []sharedRule  // rules to delete from and add to fixed chains
}

func (d *tableDiff) empty() bool {
	return len(d.write) == 0 && len(d.del) == 0 && len(d.unshare) == 0 && len(d.share) == 0
}

// diffTable compares what a service port holds in a table (old) with what
// it should hold (want); either may be nil.
func diffTable(old, want *tableRules) tableDiff {
	var d tableDiff
	if old == nil {
		old = &tableRules{}
	}
	if want == nil {
		want = &tableRules{}
	}
	for ci := range want.chains {
		c := &want.chains[ci]
		if i := slices.IndexFunc(old.chains, func(o chainRules) bool { return o.name == c.name }); i < 0 || !old.chains[i].equal(c) {
			d.write = append(d.write, c)
		}
	}
	for ci := range old.chains {
		c := &old.chains[ci]
		if !slices.ContainsFunc(want.chains, func(o chainRules) bool { return o.name == c.name }) {
			d.del = append(d.del, c)
		}
	}
	for _, s := range old.shared {
		if !slices.Contains(want.shared, s) {
			d.unshare = append(d.unshare, s)
		}
	}
	for _, s := range want.shared {
		if !slices.Contains(old.shared, s) {
			d.share = append(d.share, s)
		}
	}
	return d
}
