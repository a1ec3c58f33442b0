package iptables

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
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
	rendered := time.Since(start)
	tried := false // adopt found the fingerprint or a jump not as wanted
	if prev == nil && !b.listFirst && !b.distrust && len(errs) == 0 && b.run != nil && b.run.Tools().Flavour == iptables.NFT {
		// The nft flavour adopts on the fingerprint and the jumps, and
		// lists the chains afterwards (verify.go): the kernel's chain
		// dump is quadratic in the chains.
		t0 := time.Now()
		saved, err := b.readFingerprint(ctx)
		if err != nil {
			return fmt.Errorf("iptables: full sync: %w", err)
		}
		read := time.Since(t0)
		if saved != "" {
			var unlisted [numTables]map[string]bool // checked after the sync
			steps, err := b.adopt(ctx, want, unlisted, saved, nil)
			if err != nil {
				return fmt.Errorf("iptables: full sync: %w", err)
			}
			tried = true
			if steps.ok {
				b.startCheck(want)
				b.log.Info("full sync", "services", len(req.State.Services), "mode", "adopt", "duration", time.Since(start),
					"render", rendered, "readFingerprint", read, "fingerprint", steps.hash, "jumps", steps.jumps,
					"chains", "checked after the sync")
				return nil
			}
		}
	}
	// have holds the per-service chains the kernel may hold. jumps says
	// how to handle the jumps from the built-in chains: insert them
	// where the chains they jump to do not exist (so neither do they),
	// check them first elsewhere.
	var have [numTables]map[string]bool
	jumps := [numTables]jumpMode{jumpsCheck, jumpsCheck}
	saved := ""                    // the fingerprint our nat chains hold, as *-save lists it
	var listed map[string][]string // the nft flavour's chains by table
	var rules builtinRules         // the legacy flavour's built-in chains' rules, from *-save
	t0 := time.Now()
	if prev == nil {
		var err error
		var ok bool
		if listed, ok, err = b.run.Chains(ctx); err != nil {
			return fmt.Errorf("iptables: full sync: %w", err)
		}
		if !ok {
			rules = b.newBuiltinRules()
		}
	}
	for t := range numTables {
		var chains []string
		if prev != nil {
			chains = prev.chains(t)
		} else {
			var err error
			var targets bool
			var fp string
			if chains, targets, fp, err = b.kernelChains(ctx, t, listed, rules); err != nil {
				return fmt.Errorf("iptables: full sync: %w", err)
			}
			if !targets {
				jumps[t] = jumpsInsert
			}
			if t == tNAT {
				saved = fp
			}
		}
		have[t] = setOf(chains)
	}
	read := time.Since(t0)
	jumpsFixed := false
	if prev == nil && !tried && !b.distrust && saved != "" && len(errs) == 0 && jumps == [numTables]jumpMode{jumpsCheck, jumpsCheck} {
		if steps, err := b.adopt(ctx, want, have, saved, rules); err != nil {
			return fmt.Errorf("iptables: full sync: %w", err)
		} else if steps.ok {
			b.listFirst = false
			b.log.Info("full sync", "services", len(req.State.Services), "mode", "adopt", "duration", time.Since(start),
				"render", rendered, "readChains", read, "fingerprint", steps.hash, "jumps", steps.jumps)
			return nil
		}
	}
	// unprint says the kernel may hold a fingerprint rule, which the
	// rewrite's first run flushes: a process that dies before the last
	// commit leaves none, rather than one that describes chains the
	// rewrite changed.
	unprint := prev == nil && saved != "" || prev != nil && prev.fingerprint != ""
	b.st = nil
	for attempt := 0; ; attempt++ {
		var stale [numTables][]string
		for t := range numTables {
			stale[t] = staleChains(have[t], want[t])
		}
		nchains := 0
		for _, tr := range want[tNAT] {
			nchains += len(tr.chains)
		}
		chunk := b.chunk(nchains, len(have[tNAT]) > 0)
		secs := b.fullSections(want, stale, chunk, jumps, unprint)
		b.last = inputStats{full: true, sections: len(secs)}
		data, starts := joinSections(secs)
		b.last.lines, b.last.bytes = starts[len(starts)-1], len(data)
		offset, err := b.restoreSections(ctx, secs, data, starts, chunk)
		if err != nil {
			// The error may hold the input: write the next one
			// elsewhere.
			b.arena = nil
		}
		if err == nil {
			b.last.rules = countRules(data)
			st := newState()
			st.svcs = want
			st.fingerprint = secs[len(secs)-1].fingerprint
			b.st = st
			b.lastRewrite = time.Now()
			b.listFirst, b.distrust = false, false
			break
		}
		failed, ok := errors.AsType[*iptables.RestoreError](err)
		if !ok || failed.Line == 0 || attempt >= maxRetries {
			return fmt.Errorf("iptables: full sync: %w", err)
		}
		// Sections before the failing one are committed. failed
		// counts the lines of its own run.
		i := sort.SearchInts(starts, offset+failed.Line) - 1
		line := offset + failed.Line - starts[i]
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
			// Only the last input writes our chains in both tables
			// (the check's commits change nothing but the
			// fingerprint chain).
			if in.fingerprint != "" && in.committedBefore(t, line) {
				// The table holds want now: what the retry leaves out
				// becomes stale, and the jumps inserted are there.
				have[t] = setOf(chainsOf(want[t]))
				if jumps[t] == jumpsInsert {
					jumps[t] = jumpsCheck
				}
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
		"bytes", b.last.bytes, "render", rendered, "readChains", read, "duration", time.Since(start))
	return proxier.JoinObjectErrors(errs)
}

// restoreSections feeds the sections secs, joined in data with starts as
// joinSections returns them, to the restore program: in one run, or, when
// they hold chunk chains each (the nft flavour), in runs of about
// nftRunChains chains. When a run fails, offset is the number of lines
// before it (the runs before it and the sections before the failing one
// are committed).
func (b *backend) restoreSections(ctx context.Context, secs []*input, data []byte, starts []int, chunk int) (offset int, err error) {
	per := len(secs)
	if chunk > 0 {
		per = cmp.Or(b.runSections, max(1, nftRunChains/chunk))
	}
	pos := 0
	for i := 0; i < len(secs); i += per {
		j := min(i+per, len(secs))
		n := 0
		for _, in := range secs[i:j] {
			n += len(in.b)
		}
		if err := b.restore(ctx, data[pos:pos+n]); err != nil {
			return starts[i], err
		}
		pos += n
	}
	return 0, nil
}

// nftRunChains is about how many chains one run of iptables-nft-restore
// writes in a complete rewrite. libxtables remembers every chain name a
// run declares in a hash table of 512 buckets, which the target of every
// rule is looked up in: runs of about 30,000 chains cost a tenth less
// than one run of 100,000 (and a little less than runs of 10,000, each
// of which starts a program and rebuilds its caches). The nft flavour
// commits each section on its own anyway, so more runs change nothing
// else.
const nftRunChains = 30000

// jumpMode says what a complete rewrite does with the jumps from the
// built-in chains of a table.
type jumpMode uint8

const (
	jumpsNone   jumpMode = iota // nothing (tests)
	jumpsCheck                  // check them first (-C); missing ones are inserted and the run repeated
	jumpsInsert                 // insert them (-I), the table holding nothing of ours
)

// jumpTarget returns the target of a rule ("-j X" or "-g X" at its
// end).
func jumpTarget(rule string) string {
	if i := max(strings.LastIndex(rule, " -j "), strings.LastIndex(rule, " -g ")); i >= 0 {
		return rule[i+4:]
	}
	if strings.HasPrefix(rule, "-j ") || strings.HasPrefix(rule, "-g ") {
		return rule[3:]
	}
	return ""
}

// joinSections concatenates sections into one restore input (each ends
// with COMMIT, so each is committed on its own, in order). starts[i] is
// the number of lines before section i; the last element is the total.
// Sections written one after the other into one array (as fullSections
// does) are joined without copying.
func joinSections(secs []*input) (data []byte, starts []int) {
	size := 0
	contiguous := len(secs) > 0
	for i, in := range secs {
		size += len(in.b)
		if i > 0 && contiguous {
			p := secs[i-1].b
			contiguous = len(in.b) > 0 && cap(p)-len(p) >= len(in.b) && &p[:len(p)+1][len(p)] == &in.b[0]
		}
	}
	if contiguous {
		data = secs[0].b[:size]
	} else {
		data = make([]byte, 0, size)
		for _, in := range secs {
			data = append(data, in.b...)
		}
	}
	starts = make([]int, 0, len(secs)+1)
	lines := 0
	for _, in := range secs {
		starts = append(starts, lines)
		lines += in.lines
	}
	return data, append(starts, lines)
}

// nftChunk returns how many per-service chains one restore section (a
// "*nat ... COMMIT" block) writes in a complete rewrite of chains
// per-service chains in the nft flavour, into a table without chains of
// ours or over them (populated).
//
// iptables-nft (1.8.9) keeps the chains a section names in a sorted
// linked list, so a section of k chains costs O(k²) (10,000 services in
// one section take half an hour). Each section is a kernel transaction,
// whose commit walks every chain of the table (nft_table_validate,
// nf_tables_commit) and, once our dispatch rules reach them, validates
// every rule of ours: O(chains) per section, far more over a populated
// table. The sum, chains/k sections of c1·k² + c2·chains, is least for k
// proportional to √chains. Measured: at 111,000 chains (10,000 services
// × 10 endpoints) 1,000 into an empty table (300 to 1,500 cost about the
// same, 4,000 half as much more) and 4,000 over the same rules (1,000
// almost twice as much, 8,000 a quarter more); at 11,100 chains about
// 300 and 1,300.
func nftChunk(chains int, populated bool) int {
	c := 3.0
	if populated {
		c = 12
	}
	return max(100, int(c*math.Sqrt(float64(chains))))
}

// chunk returns the number of per-service chains a complete rewrite of
// chains per-service chains writes per section, over chains of ours
// (populated) or not; 0 means one section per table. The legacy flavour
// reads and writes the whole table for every section, so it takes one.
func (b *backend) chunk(chains int, populated bool) int {
	switch {
	case b.run == nil || b.run.Tools().Flavour != iptables.NFT:
		return 0
	case b.chunkSize > 0:
		return b.chunkSize
	}
	return nftChunk(chains, populated)
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

// kernelChains returns the per-service chains of ours in table t (what an
// earlier process left: in listed, the nft flavour's chains by table as
// [iptables.Runner.Chains] lists them, or read from *-save when listed is
// nil), whether the table holds every chain of ours
// that a built-in chain jumps to (so that the jumps may exist), and, for
// nat, the comment of the fingerprint rule if there is one.
func (b *backend) kernelChains(ctx context.Context, t table, listed map[string][]string, rules builtinRules) (chains []string, targets bool, fingerprint string, err error) {
	var out []byte
	if listed != nil {
		// The nft flavour: the chain list over netlink, and the
		// fingerprint rule alone (iptables -S of one chain reads that
		// chain only), instead of *-save of the whole table.
		if t == tNAT {
			if fingerprint, err = b.readFingerprint(ctx); err != nil {
				return nil, false, "", err
			}
		}
		for _, n := range listed[t.String()] {
			out = append(out, ":"+n+" - [0:0]\n"...)
		}
	} else if out, err = b.run.Save(ctx, t.String()); err != nil {
		return nil, false, "", err
	}
	fixed := map[string]bool{}
	for _, x := range []table{tNAT, tFilter} {
		chains, _ := b.r.fixedChains(x)
		for _, c := range chains {
			fixed[c.name] = true
		}
	}
	fixed[b.r.n.fixed(chFingerprint)] = true
	want := map[string]bool{}
	for _, j := range b.r.jumps() {
		if j.table == t {
			want[j.rule[len(j.rule)-1]] = true
		}
	}
	found := 0
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Bytes()
		if len(l) > 3 && l[0] == '-' && l[1] == 'A' {
			if t == tNAT && fingerprint == "" {
				if fp, ok := b.savedFingerprint(string(l)); ok {
					fingerprint = fp
				}
			}
			// Only the rules of the built-in chains become strings
			// (a million other rules at 30,000 services).
			if rest := l[3:]; rules != nil {
				if i := bytes.IndexByte(rest, ' '); i > 0 && rules[[2]string{t.String(), string(rest[:i])}] != nil {
					addBuiltin(rules, t, string(l))
				}
			}
		}
		if len(l) < 2 || l[0] != ':' {
			continue
		}
		name, _, _ := strings.Cut(string(l[1:]), " ")
		if want[name] {
			found++
		}
		if b.r.n.owns(name) && !fixed[name] {
			chains = append(chains, name)
		}
	}
	return chains, found == len(want), fingerprint, s.Err()
}

// readFingerprint returns the comment of the fingerprint rule of the nat
// table, "" when there is none: iptables -S of that one chain, which
// reads that chain only (iptables-nft asks the kernel for it by name,
// whatever the number of chains).
func (b *backend) readFingerprint(ctx context.Context) (string, error) {
	out, err := b.run.Command(ctx, "-t", "nat", "-S", b.r.n.fixed(chFingerprint))
	if err != nil {
		if _, ok := errors.AsType[*iptables.CommandError](err); ok {
			return "", nil // no such chain
		}
		return "", err
	}
	for l := range strings.Lines(out) {
		if fp, ok := b.savedFingerprint(strings.TrimRight(l, "\n")); ok {
			return fp, nil
		}
	}
	return "", nil
}

// builtinRules holds the rules of the built-in chains that the jumps go
// in, by table and chain, each as its arguments joined with NULs.
type builtinRules map[[2]string]map[string]bool

// newBuiltinRules returns builtinRules for the built-in chains our
// jumps go in, empty.
func (b *backend) newBuiltinRules() builtinRules {
	rules := builtinRules{}
	for _, j := range b.r.jumps() {
		rules[[2]string{j.table.String(), j.chain}] = map[string]bool{}
	}
	return rules
}

// addBuiltin adds line, a rule of table t as *-save or -S prints it, if
// it is in a built-in chain of rules.
func addBuiltin(rules builtinRules, t table, line string) {
	rest, ok := strings.CutPrefix(line, "-A ")
	if !ok {
		return
	}
	chain, args, _ := strings.Cut(rest, " ")
	if m, ok := rules[[2]string{t.String(), chain}]; ok {
		m[strings.Join(splitArgs(nil, args), "\x00")] = true
	}
}

// jumpsListed reports whether every jump from a built-in chain is in
// place, from the rules of the built-in chains as iptables prints them:
// rules, read from the legacy flavour's *-save output, or else iptables
// -S of each built-in chain. iptables-nft's -C (alone or in a restore
// run) also fetches every rule of the chain the rule jumps to, our
// dispatch chain of one rule per service port: 0.26 s for 30,000 of them,
// where -S of a built-in chain takes a few milliseconds; iptables-legacy
// reads the whole table for each run (1.8 s for both tables at 30,000
// services). A jump printed otherwise than rendered counts as missing:
// the sync rewrites.
func (b *backend) jumpsListed(ctx context.Context, rules builtinRules) (bool, error) {
	if rules == nil {
		rules = b.newBuiltinRules()
		listed := map[[2]string]bool{}
		for _, j := range b.r.jumps() {
			key := [2]string{j.table.String(), j.chain}
			if listed[key] {
				continue
			}
			listed[key] = true
			out, err := b.run.Command(ctx, "-t", key[0], "-S", key[1])
			if err != nil {
				return false, err
			}
			for l := range strings.Lines(out) {
				addBuiltin(rules, j.table, strings.TrimRight(l, "\n"))
			}
		}
	}
	for _, j := range b.r.jumps() {
		key := [2]string{j.table.String(), j.chain}
		if !rules[key][strings.Join(j.rule, "\x00")] {
			b.log.Info("a jump from a built-in chain is missing or differs", "table", key[0], "chain", key[1], "rule", strings.Join(j.rule, " "))
			return false, nil
		}
	}
	return true, nil
}

// adoptSteps says whether adopt adopted, and how long its steps took.
type adoptSteps struct {
	ok bool
	// hash is the fingerprint of want; jumps the run checking the
	// jumps from the built-in chains.
	hash, jumps time.Duration
}

// adopt makes want, which the nat table's fingerprint rule says the
// kernel holds, the state, when our per-service chains are those of want
// (have; nil when the caller checks them afterwards, see verify.go) and
// the jumps from the built-in chains are in place (in rules, when the
// caller read them, see jumpsListed). It reports whether it did; an
// error means the kernel could not be asked.
func (b *backend) adopt(ctx context.Context, want [numTables]map[model.ServicePortName]*tableRules, have [numTables]map[string]bool, saved string, rules builtinRules) (adoptSteps, error) {
	var steps adoptSteps
	start := time.Now()
	fp := b.fingerprint(want)
	steps.hash = time.Since(start)
	if fp != saved {
		return steps, nil
	}
	for t := range numTables {
		if have[t] == nil {
			continue
		}
		chains := chainsOf(want[t])
		if len(chains) != len(have[t]) {
			return steps, nil
		}
		for _, c := range chains {
			if !have[t][c] {
				return steps, nil
			}
		}
	}
	t0 := time.Now()
	ok, err := b.jumpsListed(ctx, rules)
	steps.jumps = time.Since(t0)
	if err != nil || !ok {
		return steps, err
	}
	st := newState()
	st.svcs = want
	st.fingerprint = fp
	b.st = st
	b.lastRewrite = time.Now()
	b.last = inputStats{full: true, adopted: true}
	b.log.Debug("adopted our chains", "fingerprint", fp, "duration", time.Since(start))
	steps.ok = true
	return steps, nil
}

// fullSections writes the restore input of a complete rewrite, as
// sections to be joined. With chunk 0 it is one input: every table with
// its fixed chains, the chains and rules of every service port in want,
// and the deletion of stale chains. With chunk > 0 the fixed chains the
// service chains jump to come first, then the service ports' own chains
// in sections of about chunk chains each, and a last input holds the
// rest. Either way the dispatch rules change last, so the old ones keep
// pointing at chains that exist.
//
// The fingerprint rule goes in the last commit, the last input's nat
// section (after its filter one); with unprint set, the first commit,
// before anything else changes, flushes the fingerprint chain
// (fingerprint.go).
//
// The sections are written one after the other into b.arena when it is
// large enough (else into a new array of the estimated size), so that
// joinSections copies nothing.
func (b *backend) fullSections(want [numTables]map[model.ServicePortName]*tableRules, stale [numTables][]string, chunk int, jumps [numTables]jumpMode, unprint bool) []*input {
	var secs []*input
	var names [numTables][]model.ServicePortName
	for t := range numTables {
		names[t] = slices.SortedFunc(maps.Keys(want[t]), model.ServicePortName.Compare)
	}
	size := inputSize(want, stale)
	if cap(b.arena) < size {
		b.arena = make([]byte, 0, size+size/8)
	}
	used := b.arena[:0]
	// section starts a section where the last kept one ended.
	section := func() *input {
		return &input{b: used[len(used):len(used)]}
	}
	// keep adds a finished section.
	keep := func(in *input) {
		secs = append(secs, in)
		if len(in.b) > 0 && cap(used)-len(used) >= len(in.b) && &used[:len(used)+1][len(used)] == &in.b[0] {
			used = used[:len(used)+len(in.b)]
		}
	}
	// Jumps to check come first: when one is missing, nothing is
	// committed yet. The fingerprint chain is flushed in the same nat
	// commit (the legacy flavour reads the table for the check anyway).
	check := section()
	for t := range numTables {
		flush := unprint && t == tNAT
		if jumps[t] != jumpsCheck && !flush {
			continue
		}
		check.begin(t)
		if flush {
			check.declare(b.r.n.fixed(chFingerprint))
		}
		if jumps[t] != jumpsCheck {
			check.commit()
			continue
		}
		check.mark(spanJump, nil)
		for _, j := range b.r.jumps() {
			if j.table == t {
				check.line("-C ", j.chain, " ", restoreArgs(j.rule))
			}
		}
		check.commit()
	}
	if check.lines > 0 {
		keep(check)
	}
	if chunk > 0 {
		// The fixed chains the service ports' chains jump to come
		// first.
		fixed, _ := b.r.fixedChains(tNAT)
		pre := section()
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
			keep(pre)
		}
		// The service ports' chains go in order of the service ports,
		// whose hashed chain names come in no order: iptables-nft-save
		// sorts the chains the kernel lists (in the order they were
		// made) with a quicksort that recurses once per chain on a
		// sorted list.
		var in *input
		count := 0
		flush := func() {
			if in != nil {
				in.commit()
				keep(in)
				in = nil
			}
		}
		for t := range numTables {
			for i, n := range names[t] {
				tr := want[t][n]
				if len(tr.chains) == 0 {
					continue
				}
				if in != nil && (count >= chunk || in.cur != t) {
					flush()
				}
				if in == nil {
					in, count = section(), 0
					in.begin(t)
				}
				in.svcs = append(in.svcs, n)
				in.mark(spanService, &names[t][i])
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
	in := section()
	in.fingerprint = b.fingerprint(want)
	// Filter first: nat, with the fingerprint rule, commits last.
	for _, t := range []table{tFilter, tNAT} {
		fixed, tail := b.r.fixedChains(t)
		if chunk > 0 {
			fixed = slices.DeleteFunc(fixed, func(c chainRules) bool { return b.r.sharedTarget(c.name) })
		}
		in.begin(t)
		var sorted []decl
		if chunk == 0 {
			sorted = declareDescending(in, fixed, names[t], want[t], stale[t])
		} else {
			for _, c := range fixed {
				in.declare(c.name)
			}
			in.fixed()
			for _, c := range stale[t] {
				in.declare(c)
			}
		}
		in.fixed()
		for _, c := range fixed {
			for _, r := range c.rules {
				in.appendRule(c.name, r)
			}
		}
		if t == tNAT {
			b.writeFingerprint(in, in.fingerprint)
		}
		if chunk > 0 {
			// iptables-nft inserts every jump target into a sorted
			// list; targets in descending order go in at its head.
			type owned struct {
				svc *model.ServicePortName
				s   sharedRule
			}
			var all []owned
			for i, n := range names[t] {
				for _, s := range want[t][n].shared {
					all = append(all, owned{&names[t][i], s})
				}
			}
			slices.SortStableFunc(all, func(a, b owned) int {
				return cmp.Or(cmp.Compare(a.s.chain, b.s.chain), -cmp.Compare(jumpTarget(a.s.rule), jumpTarget(b.s.rule)))
			})
			for _, o := range all {
				in.mark(spanService, o.svc)
				in.appendRule(o.s.chain, o.s.rule)
			}
		} else {
			// The service ports' chains in the order they were
			// declared: libiptc finds each next chain near the last.
			for _, d := range sorted {
				if d.chain != nil {
					in.mark(spanService, d.svc)
					for _, r := range d.chain.rules {
						in.appendRule(d.name, r)
					}
				}
			}
			for i, n := range names[t] {
				in.mark(spanService, &names[t][i])
				for _, s := range want[t][n].shared {
					in.appendRule(s.chain, s.rule)
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
	keep(in)
	return secs
}

// decl is a chain declaration of a complete rewrite.
type decl struct {
	name  string
	svc   *model.ServicePortName // nil: fixed or stale
	chain *chainRules            // a service port's chain; nil: fixed or stale
}

// declareDescending declares the fixed chains, the chains of the service
// ports names and the stale chains of one table, in descending order of
// their names, each line in the span of its owner, and returns them in
// that order. libiptc (the legacy flavour) keeps a table's chains in a
// sorted list that it searches from an index rebuilt every few hundred
// new chains; a chain smaller than all it holds goes in at the head,
// while one in no particular order walks a good part of the list: for
// 100,000 chains, this order saves a tenth to a fifth of the program's
// time, and appending the rules in the same order another tenth.
func declareDescending(in *input, fixed []chainRules, names []model.ServicePortName, want map[model.ServicePortName]*tableRules, stale []string) []decl {
	n := len(fixed) + len(stale)
	for _, tr := range want {
		n += len(tr.chains)
	}
	all := make([]decl, 0, n)
	for _, c := range fixed {
		all = append(all, decl{name: c.name})
	}
	for _, c := range stale {
		all = append(all, decl{name: c})
	}
	for i, sn := range names {
		tr := want[sn]
		for j := range tr.chains {
			all = append(all, decl{tr.chains[j].name, &names[i], &tr.chains[j]})
		}
	}
	slices.SortFunc(all, func(a, b decl) int { return strings.Compare(b.name, a.name) })
	for _, d := range all {
		if d.svc != nil {
			in.mark(spanService, d.svc)
		} else {
			in.fixed()
		}
		in.declare(d.name)
	}
	return all
}

// inputSize estimates the size of the restore input of a complete
// rewrite of want.
func inputSize(want [numTables]map[model.ServicePortName]*tableRules, stale [numTables][]string) int {
	size := 1 << 16
	for t := range numTables {
		for _, tr := range want[t] {
			for _, c := range tr.chains {
				size += 2*len(c.name) + 16
				for _, r := range c.rules {
					size += len(c.name) + len(r) + 5
				}
			}
			for _, s := range tr.shared {
				size += len(s.chain) + len(s.rule) + 8
			}
		}
		for _, c := range stale[t] {
			size += 2*len(c) + 16
		}
	}
	return size
}
