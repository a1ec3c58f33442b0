package iptables

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// backend programs one IP family of one network namespace.
type backend struct {
	cfg Config
	fam model.IPFamily
	ns  *netns.NS
	run *iptables.Runner
	r   *renderer
	log *slog.Logger
	// st is what the kernel holds as of the last successful sync; nil
	// when unknown (before the first sync, after a failure or Cleanup).
	st *state
	// lastRewrite is when syncFull last rewrote everything.
	lastRewrite time.Time
	// last describes the last restore input, for tests and benchmarks.
	last inputStats
}

var _ proxier.Backend = (*backend)(nil)

// inputStats describes a restore input.
type inputStats struct {
	full         bool
	runs         int
	lines, bytes int
}

// state is what the kernel holds, per table and service port, kept in
// memory so a partial sync never reads the kernel.
type state struct {
	svcs [numTables]map[model.ServicePortName]*tableRules
}

func newState() *state {
	st := &state{}
	for t := range numTables {
		st.svcs[t] = map[model.ServicePortName]*tableRules{}
	}
	return st
}

// chains returns the per-service chains of table t.
func (st *state) chains(t table) []string { return chainsOf(st.svcs[t]) }

func chainsOf(m map[model.ServicePortName]*tableRules) []string {
	var out []string
	for _, tr := range m {
		for _, c := range tr.chains {
			out = append(out, c.name)
		}
	}
	return out
}

// Name returns "iptables".
func (b *backend) Name() string { return "iptables" }

// Family returns the backend's IP family.
func (b *backend) Family() model.IPFamily { return b.fam }

// maxRetries bounds how often a sync leaves out a service port whose rule
// the restore program refused and tries again.
const maxRetries = 5

// errCanary says a partial sync found a canary chain gone, or another
// sign that the kernel no longer holds what the state in memory says.
var errCanary = errors.New("canary chain gone")

// Sync makes the kernel match req.
//
// The first sync of a process, a sync after a failure or after our chains
// were flushed, and a full request once per [Config.RewriteInterval]
// rewrite every chain the backend owns. Other syncs write only the
// difference between the state kept in memory and req: for the changed
// service ports, or for all of them when req is full (which also checks
// the jumps from the built-in chains). Every such sync first checks the
// canary chains; when one was flushed it rewrites everything instead.
func (b *backend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.run == nil {
		return errors.New("iptables: backend is closed")
	}
	if req == nil || req.State == nil {
		return errors.New("iptables: sync request without state")
	}
	if req.State.Family != 0 && req.State.Family != b.fam {
		return fmt.Errorf("iptables: %s backend got %s state", b.fam, req.State.Family)
	}
	if b.st == nil || req.Full && time.Since(b.lastRewrite) >= b.cfg.RewriteInterval {
		return b.syncFull(ctx, req)
	}
	names := req.Changed
	if req.Full {
		// Compare everything: ports skipped earlier get another chance.
		names = make(map[model.ServicePortName]struct{}, len(req.State.Services))
		for n := range req.State.Services {
			names[n] = struct{}{}
		}
		for t := range numTables {
			for n := range b.st.svcs[t] {
				names[n] = struct{}{}
			}
		}
	}
	err := b.syncPartial(ctx, req, names)
	if errors.Is(err, errCanary) {
		b.log.Warn("our chains were flushed behind our back (canary gone); rewriting everything")
		b.st = nil
		return b.syncFull(ctx, req)
	}
	if req.Full && (err == nil || onlyObjectErrors(err)) {
		if jerr := b.ensureJumps(ctx); jerr != nil {
			return errors.Join(err, fmt.Errorf("iptables: %w", jerr))
		}
	}
	return err
}

// onlyObjectErrors reports whether err holds [*proxier.ObjectError]s only.
func onlyObjectErrors(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if _, ok := e.(*proxier.ObjectError); !ok {
				return false
			}
		}
		return true
	}
	_, ok := err.(*proxier.ObjectError)
	return ok
}

// render renders name, reporting a service port that cannot be rendered
// in errs.
func (b *backend) render(req *proxier.SyncRequest, name model.ServicePortName, errs map[model.ServicePortName]error) (rendering, bool) {
	sp := req.State.Services[name]
	if sp == nil {
		return rendering{}, true
	}
	rd, err := b.r.service(name, sp, req.Targets[name])
	if err != nil {
		errs[name] = err
		return rendering{}, false
	}
	return rd, true
}

// syncFull rewrites every chain the backend owns, deletes the chains of
// ours the kernel holds but the request does not need, and makes sure the
// jumps from the built-in chains are in place.
func (b *backend) syncFull(ctx context.Context, req *proxier.SyncRequest) error {
	start := time.Now()
	prev := b.st
	// have holds the per-service chains the kernel may hold.
	var have [numTables]map[string]bool
	for t := range numTables {
		var chains []string
		if prev != nil {
			chains = prev.chains(t)
		} else {
			var err error
			if chains, err = b.kernelChains(ctx, t); err != nil {
				return fmt.Errorf("iptables: full sync: %w", err)
			}
		}
		have[t] = setOf(chains)
	}
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
		runs := b.fullRuns(want, stale, b.chunk())
		b.last = inputStats{full: true, runs: len(runs)}
		data, starts := joinRuns(runs)
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
		in := runs[i]
		for _, r := range runs[:i] {
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
	if err := b.ensureJumps(ctx); err != nil {
		return fmt.Errorf("iptables: full sync: %w", err)
	}
	b.log.Info("full sync", "services", len(req.State.Services), "runs", b.last.runs, "lines", b.last.lines,
		"bytes", b.last.bytes, "duration", time.Since(start))
	return joinObjectErrors(errs)
}

// jumpTarget returns the target of a rule ("-j X" at its end).
func jumpTarget(rule string) string {
	if i := strings.LastIndex(rule, " -j "); i >= 0 {
		return rule[i+4:]
	}
	return ""
}

// joinRuns concatenates the inputs of runs into one restore input (each
// ends with COMMIT, so each is committed on its own, in order). starts[i]
// is the number of lines before run i; the last element is the total.
func joinRuns(runs []*input) (data []byte, starts []int) {
	size := 0
	for _, in := range runs {
		size += len(in.b)
	}
	data = make([]byte, 0, size)
	starts = make([]int, 0, len(runs)+1)
	lines := 0
	for _, in := range runs {
		starts = append(starts, lines)
		data = append(data, in.b...)
		lines += in.lines
	}
	return data, append(starts, lines)
}

// nftChunk is how many per-service chains one run of iptables-nft-restore
// writes in a full sync. iptables-nft (1.8.9) keeps the chains a run
// names in a sorted linked list, so a run costs O(chains²): 10,000
// services in one run take half an hour, in runs of this size seconds.
const nftChunk = 1500

// chunk returns the number of per-service chains a full sync writes per
// run; 0 means one run for everything. The legacy flavour rewrites the
// whole table blob on every run, so it takes one.
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
// iptables-save lists them: what an earlier process left.
func (b *backend) kernelChains(ctx context.Context, t table) ([]string, error) {
	out, err := b.run.Save(ctx, t.String())
	if err != nil {
		return nil, err
	}
	fixed := map[string]bool{}
	for _, x := range []table{tNAT, tFilter} {
		chains, _ := b.r.fixedChains(x)
		for _, c := range chains {
			fixed[c.name] = true
		}
	}
	var chains []string
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Bytes()
		if len(l) < 2 || l[0] != ':' {
			continue
		}
		name, _, _ := strings.Cut(string(l[1:]), " ")
		if b.r.n.owns(name) && !fixed[name] {
			chains = append(chains, name)
		}
	}
	return chains, s.Err()
}

// fullRuns writes the restore inputs of a full sync. With chunk 0 it is
// one input: every table with its fixed chains, the chains and rules of
// every service port in want, and the deletion of stale chains. With
// chunk > 0 the service ports' own chains come first, in inputs of about
// chunk chains each, and a last input holds the rest. Either way the
// dispatch rules change last, so the old ones keep pointing at chains
// that exist.
func (b *backend) fullRuns(want [numTables]map[model.ServicePortName]*tableRules, stale [numTables][]string, chunk int) []*input {
	var runs []*input
	var names [numTables][]model.ServicePortName
	for t := range numTables {
		names[t] = slices.SortedFunc(maps.Keys(want[t]), compareNames)
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
		runs = append(runs, pre)
		var in *input
		count := 0
		flush := func() {
			if in != nil {
				in.commit()
				runs = append(runs, in)
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
		in.commit()
	}
	if chunk == 0 {
		in.svcs = names[tNAT]
	}
	return append(runs, in)
}

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
	for attempt := 0; ; attempt++ {
		in := b.partialInput(want, req.Full)
		b.last = inputStats{runs: 1, lines: in.lines, bytes: len(in.b)}
		if in.lines == 0 {
			b.commit(want, numTables)
			break
		}
		err := b.run.Restore(ctx, in.b)
		if err == nil {
			b.commit(want, numTables)
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
			}
		}
		sp, ok := in.lookup(re.Line)
		switch {
		case ok && sp.kind == spanCanary:
			return errCanary
		case strings.HasPrefix(re.Text, "-D ") || strings.HasPrefix(re.Text, "-X "):
			// A rule or chain of ours is not as we left it: the
			// kernel no longer matches the state in memory.
			b.log.Warn("our rules were changed behind our back", "line", re.Line, "err", re.Msg)
			return errCanary
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
	return joinObjectErrors(errs)
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
// legacy flavour reads and writes a whole table for each section).
func (b *backend) partialInput(want [numTables]map[model.ServicePortName]*tableRules, always bool) *input {
	in := newInput(4096)
	canary := b.r.n.fixed(chCanary)
	for t := range numTables {
		names := slices.SortedFunc(maps.Keys(want[t]), compareNames)
		diffs := make([]tableDiff, len(names))
		changed := false
		for i, n := range names {
			diffs[i] = diffTable(b.st.svcs[t][n], want[t][n])
			changed = changed || !diffs[i].empty()
		}
		if !changed && !always {
			continue
		}
		in.begin(t)
		in.mark(spanCanary, model.ServicePortName{})
		in.line("-D ", canary, " ", canaryRule)
		in.appendRule(canary, canaryRule)
		// Declarations first (creating or flushing), then the rules of
		// the fixed chains (removed before added), then the new chain
		// contents, then the deletion of chains nothing refers to any
		// more.
		for i, n := range names {
			in.mark(spanService, n)
			for _, c := range diffs[i].write {
				in.declare(c.name)
			}
			for _, c := range diffs[i].del {
				in.declare(c.name)
			}
		}
		for i, n := range names {
			in.mark(spanService, n)
			for _, s := range diffs[i].unshare {
				in.line("-D ", s.chain, " ", s.rule)
			}
		}
		for i, n := range names {
			in.mark(spanService, n)
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
		for i, n := range names {
			in.mark(spanService, n)
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

// ensureJumps inserts the jumps from the built-in chains that are
// missing, at the top of their chains. Present ones are left alone.
func (b *backend) ensureJumps(ctx context.Context) error {
	for _, j := range b.r.jumps() {
		ok, err := b.run.Check(ctx, j.table.String(), j.chain, j.rule...)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		args := append([]string{"-t", j.table.String(), "-I", j.chain, "1"}, j.rule...)
		if _, err := b.run.Command(ctx, args...); err != nil {
			return err
		}
		b.log.Info("inserted jump", "table", j.table.String(), "chain", j.chain, "rule", strings.Join(j.rule, " "))
	}
	return nil
}

// refused describes a line the restore program refused.
func refused(re *iptables.RestoreError) error {
	return fmt.Errorf("%s refused line %d (%s): %s", re.Program, re.Line, re.Text, re.Msg)
}

func joinObjectErrors(m map[model.ServicePortName]error) error {
	var errs []error
	for _, n := range slices.SortedFunc(maps.Keys(m), compareNames) {
		errs = append(errs, &proxier.ObjectError{Service: n, Err: m[n]})
	}
	return errors.Join(errs...)
}

func compareNames(a, b model.ServicePortName) int {
	return cmp.Or(
		cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Protocol, b.Protocol),
	)
}
