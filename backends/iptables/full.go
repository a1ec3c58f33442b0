package iptables

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file is the complete rewrite of everything the backend owns.

// syncFull rewrites every chain the backend owns, deletes the chains of
// ours the kernel holds but the request does not need, and makes sure the
// jumps from the built-in chains are in place.
func (b *backend) syncFull(ctx context.Context, req *proxier.SyncRequest) error {
	start := time.Now()
	prev := b.st
	// have holds the per-service chains the kernel may hold. jumps says
	// how to handle the jumps from the built-in chains: insert them
	// where the chains they jump to do not exist (so neither do they),
	// check them first elsewhere.
	var have [numTables]map[string]bool
	jumps := [numTables]jumpMode{jumpsCheck, jumpsCheck}
	for t := range numTables {
		var chains []string
		if prev != nil {
			chains = prev.chains(t)
		} else {
			var err error
			var targets bool
			if chains, targets, err = b.kernelChains(ctx, t); err != nil {
				return fmt.Errorf("iptables: full sync: %w", err)
			}
			if !targets {
				jumps[t] = jumpsInsert
			}
		}
		have[t] = setOf(chains)
	}
	jumpsFixed := false
	errs := map[model.ServicePortName]error{}
	var want [numTables]map[model.ServicePortName]*tableRules
	for t := range numTables {
		want[t] = make(map[model.ServicePortName]*tableRules, len(req.State.Services))
	}
	for name := range req.State.Services {
		rd, ok := b.render(req, name, errs)
		if !ok {
			// Keep what the kernel has, if we know it.
			rd = prev.rendering(name)
		}
		for t := range numTables {
			if rd[t] != nil {
				want[t][name] = rd[t]
			}
		}
	}
	b.st = nil
	for attempt := 0; ; attempt++ {
		var stale [numTables][]string
		for t := range numTables {
			stale[t] = staleChains(have[t], want[t])
		}
		secs := b.fullSections(want, stale, b.chunk(), jumps)
		b.last = inputStats{full: true, sections: len(secs)}
		data, starts := joinSections(secs)
		b.last.lines, b.last.bytes = starts[len(starts)-1], len(data)
		err := b.run.Restore(ctx, data)
		if err == nil {
			st := newState()
			st.svcs = want
			b.st = st
			b.lastRewrite = time.Now()
			break
		}
		failed, ok := errors.AsType[*iptables.RestoreError](err)
		if !ok || failed.Line == 0 || attempt >= maxRetries {
			return fmt.Errorf("iptables: full sync: %w", err)
		}
		// Sections before the failing one are committed.
		i := sort.SearchInts(starts, failed.Line) - 1
		line := failed.Line - starts[i]
		in := secs[i]
		for _, r := range secs[:i] {
			for _, n := range r.svcs {
				for t := range numTables {
					if tr := want[t][n]; tr != nil {
						for _, c := range tr.chains {
							have[t][c.name] = true
						}
					}
				}
			}
		}
		for t := range numTables {
			if in.committedBefore(t, line) {
				// The table holds want now: what the retry leaves out
				// becomes stale.
				have[t] = setOf(chainsOf(want[t]))
			}
		}
		sp, ok := in.lookup(line)
		if ok && sp.kind == spanJump && !jumpsFixed {
			// Checked first: nothing is committed yet.
			b.log.Warn("a jump from a built-in chain is missing", "rule", failed.Text)
			if err := b.ensureJumps(ctx); err != nil {
				return fmt.Errorf("iptables: full sync: %w", err)
			}
			jumpsFixed = true
			continue
		}
		if !ok || sp.kind != spanService {
			return fmt.Errorf("iptables: full sync: %w", failed)
		}
		b.log.Warn("restore refused a service port's rules; leaving it out", "service", sp.svc.String(),
			"line", failed.Line, "err", failed.Msg)
		errs[sp.svc] = refused(failed)
		rd := prev.rendering(sp.svc)
		for t := range numTables {
			if rd[t] != nil {
				want[t][sp.svc] = rd[t]
			} else {
				delete(want[t], sp.svc)
			}
		}
	}
	b.log.Info("full sync", "services", len(req.State.Services), "sections", b.last.sections, "lines", b.last.lines,
		"bytes", b.last.bytes, "duration", time.Since(start))
	return joinObjectErrors(errs)
}

// jumpMode says what a complete rewrite does with the jumps from the
// built-in chains of a table.
type jumpMode uint8

const (
	jumpsNone   jumpMode = iota // nothing (tests)
	jumpsCheck                  // check them first (-C); missing ones are inserted and the run repeated
	jumpsInsert                 // insert them (-I), the table holding nothing of ours
)

// jumpTarget returns the target of a rule ("-j X" at its end).
func jumpTarget(rule string) string {
	if i := strings.LastIndex(rule, " -j "); i >= 0 {
		return rule[i+4:]
	}
	return ""
}

// joinSections concatenates sections into one restore input (each ends
// with COMMIT, so each is committed on its own, in order). starts[i] is
// the number of lines before section i; the last element is the total.
func joinSections(secs []*input) (data []byte, starts []int) {
	size := 0
	for _, in := range secs {
		size += len(in.b)
	}
	data = make([]byte, 0, size)
	starts = make([]int, 0, len(secs)+1)
	lines := 0
	for _, in := range secs {
		starts = append(starts, lines)
		data = append(data, in.b...)
		lines += in.lines
	}
	return data, append(starts, lines)
}

// nftChunk is how many per-service chains one restore section (a "*nat
// ... COMMIT" block) writes in a complete rewrite of the nft flavour.
// iptables-nft (1.8.9) keeps the chains a section names in a sorted
// linked list, so a section costs O(chains²): 10,000 services in one
// take half an hour, in sections of this size seconds. (Each section is
// a kernel transaction, which validates the table: far fewer sections
// cost time too.)
const nftChunk = 1500

// chunk returns the number of per-service chains a complete rewrite
// writes per section; 0 means one section per table. The legacy flavour
// reads and writes the whole table for every section, so it takes one.
func (b *backend) chunk() int {
	if b.run != nil && b.run.Tools().Flavour == iptables.NFT {
		return nftChunk
	}
	return 0
}

func setOf(s []string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, x := range s {
		m[x] = true
	}
	return m
}

// rendering returns what st holds for name; nothing when st is nil.
func (st *state) rendering(name model.ServicePortName) rendering {
	var rd rendering
	if st == nil {
		return rd
	}
	for t := range numTables {
		rd[t] = st.svcs[t][name]
	}
	return rd
}

// staleChains returns the chains of have that want does not hold, sorted.
func staleChains(have map[string]bool, want map[model.ServicePortName]*tableRules) []string {
	if len(have) == 0 {
		return nil
	}
	keep := make(map[string]bool, len(want)*4)
	for _, tr := range want {
		for _, c := range tr.chains {
			keep[c.name] = true
		}
	}
	var out []string
	for c := range have {
		if !keep[c] {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// kernelChains returns the per-service chains of ours in table t, as
// iptables-save lists them (what an earlier process left), and whether
// the table holds every chain of ours that a built-in chain jumps to (so
// that the jumps may exist).
func (b *backend) kernelChains(ctx context.Context, t table) ([]string, bool, error) {
	out, err := b.run.Save(ctx, t.String())
	if err != nil {
		return nil, false, err
	}
	fixed := map[string]bool{}
	for _, x := range []table{tNAT, tFilter} {
		chains, _ := b.r.fixedChains(x)
		for _, c := range chains {
			fixed[c.name] = true
		}
	}
	var chains []string
	targets := map[string]bool{}
	for _, j := range b.r.jumps() {
		if j.table == t {
			targets[j.rule[len(j.rule)-1]] = true
		}
	}
	found := 0
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Bytes()
		if len(l) < 2 || l[0] != ':' {
			continue
		}
		name, _, _ := strings.Cut(string(l[1:]), " ")
		if targets[name] {
			found++
		}
		if b.r.n.owns(name) && !fixed[name] {
			chains = append(chains, name)
		}
	}
	return chains, found == len(targets), s.Err()
}

// fullSections writes the restore input of a complete rewrite, as
// sections to be joined. With chunk 0 it is one input: every table with
// its fixed chains, the chains and rules of every service port in want,
// and the deletion of stale chains. With chunk > 0 the fixed chains the
// service chains jump to come first, then the service ports' own chains
// in sections of about chunk chains each, and a last input holds the
// rest. Either way the dispatch rules change last, so the old ones keep
// pointing at chains that exist.
func (b *backend) fullSections(want [numTables]map[model.ServicePortName]*tableRules, stale [numTables][]string, chunk int, jumps [numTables]jumpMode) []*input {
	var secs []*input
	var names [numTables][]model.ServicePortName
	for t := range numTables {
		names[t] = slices.SortedFunc(maps.Keys(want[t]), compareNames)
	}
	// Jumps to check come first: when one is missing, nothing is
	// committed yet.
	check := newInput(1024)
	for t := range numTables {
		if jumps[t] != jumpsCheck {
			continue
		}
		check.begin(t)
		check.mark(spanJump, model.ServicePortName{})
		for _, j := range b.r.jumps() {
			if j.table == t {
				check.line("-C ", j.chain, " ", restoreArgs(j.rule))
			}
		}
		check.commit()
	}
	if check.lines > 0 {
		secs = append(secs, check)
	}
	if chunk > 0 {
		// The fixed chains the service ports' chains jump to come
		// first.
		fixed, _ := b.r.fixedChains(tNAT)
		pre := newInput(1024)
		pre.begin(tNAT)
		for _, c := range fixed {
			if b.r.sharedTarget(c.name) {
				pre.declare(c.name)
				for _, r := range c.rules {
					pre.appendRule(c.name, r)
				}
			}
		}
		pre.commit()
		if pre.lines > 2 {
			secs = append(secs, pre)
		}
		var in *input
		count := 0
		flush := func() {
			if in != nil {
				in.commit()
				secs = append(secs, in)
				in = nil
			}
		}
		for t := range numTables {
			for _, n := range names[t] {
				tr := want[t][n]
				if len(tr.chains) == 0 {
					continue
				}
				if in != nil && (count >= chunk || in.cur != t) {
					flush()
				}
				if in == nil {
					in, count = newInput(chunk*256), 0
					in.begin(t)
				}
				in.svcs = append(in.svcs, n)
				in.mark(spanService, n)
				for _, c := range tr.chains {
					in.declare(c.name)
				}
				for _, c := range tr.chains {
					for _, r := range c.rules {
						in.appendRule(c.name, r)
					}
				}
				count += len(tr.chains)
			}
		}
		flush()
	}
	size := 4096
	for t := range numTables {
		size += len(want[t]) * 256
		if chunk == 0 {
			size += len(want[t]) * 2048
		}
	}
	in := newInput(size)
	for t := range numTables {
		fixed, tail := b.r.fixedChains(t)
		if chunk > 0 {
			fixed = slices.DeleteFunc(fixed, func(c chainRules) bool { return b.r.sharedTarget(c.name) })
		}
		in.begin(t)
		for _, c := range fixed {
			in.declare(c.name)
		}
		if chunk == 0 {
			for _, n := range names[t] {
				if tr := want[t][n]; len(tr.chains) > 0 {
					in.mark(spanService, n)
					for _, c := range tr.chains {
						in.declare(c.name)
					}
				}
			}
		}
		in.fixed()
		for _, c := range stale[t] {
			in.declare(c)
		}
		for _, c := range fixed {
			for _, r := range c.rules {
				in.appendRule(c.name, r)
			}
		}
		if chunk > 0 {
			// iptables-nft inserts every jump target into a sorted
			// list; targets in descending order go in at its head.
			type owned struct {
				svc model.ServicePortName
				s   sharedRule
			}
			var all []owned
			for _, n := range names[t] {
				for _, s := range want[t][n].shared {
					all = append(all, owned{n, s})
				}
			}
			slices.SortStableFunc(all, func(a, b owned) int {
				return cmp.Or(cmp.Compare(a.s.chain, b.s.chain), -cmp.Compare(jumpTarget(a.s.rule), jumpTarget(b.s.rule)))
			})
			for _, o := range all {
				in.mark(spanService, o.svc)
				in.appendRule(o.s.chain, o.s.rule)
			}
		}
		for _, n := range names[t] {
			if chunk > 0 {
				break
			}
			tr := want[t][n]
			in.mark(spanService, n)
			for _, s := range tr.shared {
				in.appendRule(s.chain, s.rule)
			}
			for _, c := range tr.chains {
				for _, r := range c.rules {
					in.appendRule(c.name, r)
				}
			}
		}
		in.fixed()
		for _, s := range tail {
			in.appendRule(s.chain, s.rule)
		}
		for _, c := range stale[t] {
			in.line("-X ", c)
		}
		if jumps[t] == jumpsInsert {
			for _, j := range slices.Backward(b.r.jumps()) {
				if j.table == t {
					in.line("-I ", j.chain, " 1 ", restoreArgs(j.rule))
				}
			}
		}
		in.commit()
	}
	if chunk == 0 {
		in.svcs = names[tNAT]
	}
	return append(secs, in)
}
