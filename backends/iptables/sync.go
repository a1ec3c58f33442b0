package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// backend programs one IP family of one network namespace.
type backend struct {
	cfg  Config
	fam  model.IPFamily
	ns   *netns.NS
	lock *ownerlock.Lock // these chains in this namespace are ours
	run  *iptables.Runner
	r    *renderer
	log  *slog.Logger
	// st is what the kernel holds as of the last successful sync; nil
	// when unknown (before the first sync, after a failure or Cleanup).
	st *state
	// lastRewrite is when syncFull last rewrote everything.
	lastRewrite time.Time
	// last describes the last restore input, for tests and benchmarks.
	last inputStats
	// metrics counts the rules and failed restores.
	metrics *ruleMetrics
	// arena is the buffer complete rewrites write their input in, kept
	// for the next one (nil after a failure, whose error may hold it).
	arena []byte
	// rewrite, set by tests only, replaces a service port's rendering
	// before it is programmed: tests make the kernel refuse a service
	// port's rules with it. The renderer has no test hooks.
	rewrite func(model.ServicePortName, rendering) rendering
	// check is the listing of our chains that an adopting first sync
	// leaves running (verify.go); nil when none.
	check *chainCheck
	// listFirst makes the next first sync list our chains before
	// adopting them, as the legacy flavour always does: set when a
	// check found them not as adopted, or could not tell.
	listFirst bool
	// distrust makes the complete rewrites until one succeeds write
	// everything, whatever the fingerprint rule says: set when a
	// partial sync found our rules changed behind our back (a flushed
	// table may keep the fingerprint chain of the other, and the jumps
	// the sync put back).
	distrust bool
	// listChains, set by tests only, replaces the runner's
	// ChainsChecked in the check.
	listChains chainLister
	// chunkSize and runSections, set by tests only, replace the nft
	// flavour's section size (nftChunk) and the number of sections per
	// run (from nftRunChains).
	chunkSize, runSections int
	// restoreHook, set by tests only, runs each restore input instead of
	// the runner: tests kill a sync between two commits with it.
	restoreHook func(ctx context.Context, data []byte) error
}

var _ proxier.Backend = (*backend)(nil)

// inputStats describes a restore input.
type inputStats struct {
	full bool
	// adopted is set when a first sync found our chains holding what
	// it would write, and restored nothing.
	adopted      bool
	sections     int
	lines, bytes int
	// rules counts the rules the input appends or inserts, per table
	// (kubeproxy_sync_proxy_rules_iptables_last).
	rules [numTables]int
}

// countRules returns the rules restore input data appends or inserts, per
// table.
func countRules(data []byte) [numTables]int {
	var n [numTables]int
	t := table(-1)
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		switch {
		case len(line) > 1 && line[0] == '*':
			t = table(-1)
			for i, name := range tableNames {
				if string(line[1:]) == name {
					t = table(i)
				}
			}
		case t >= 0 && (bytes.HasPrefix(line, []byte("-A ")) || bytes.HasPrefix(line, []byte("-I "))):
			n[t]++
		}
	}
	return n
}

// restore runs the restore program on data, counting a failure in
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total (but not one
// due to ctx ending).
func (b *backend) restore(ctx context.Context, data []byte) error {
	var err error
	if b.restoreHook != nil {
		err = b.restoreHook(ctx, data)
	} else {
		err = b.run.Restore(ctx, data)
	}
	if err != nil && ctx.Err() == nil && b.metrics != nil {
		b.metrics.failures.Inc()
	}
	return err
}

// state is what the kernel holds, per table and service port, kept in
// memory so a partial sync never reads the kernel.
type state struct {
	svcs [numTables]map[model.ServicePortName]*tableRules
	// fingerprint is the comment of the fingerprint rule the kernel
	// holds (see fingerprint.go); empty once a partial sync flushed it.
	fingerprint string
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

// errDrift says a partial sync found that the kernel no longer holds what
// the state in memory says: a canary chain was flushed, or a rule or
// chain to delete is gone.
var errDrift = errors.New("our rules were changed behind our back")

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
	err := b.sync(ctx, req)
	if b.metrics != nil && b.run != nil && (err == nil || proxier.OnlyObjectErrors(err)) {
		b.metrics.observe(b.r, b.st, &b.last)
	}
	return err
}

func (b *backend) sync(ctx context.Context, req *proxier.SyncRequest) error {
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
	b.collectCheck(ctx)
	if nodeIP := proxier.PrimaryNodeIP(b.cfg.Config, req, b.fam); nodeIP != b.r.nodeIP {
		// Source ranges depend on it; a change is rare.
		b.r.nodeIP = nodeIP
		return b.syncFull(ctx, req)
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
	if err != nil && !proxier.OnlyObjectErrors(err) && ctx.Err() == nil && b.metrics != nil {
		// As kube-proxy counts a partial sync that failed (the next
		// one rewrites everything).
		b.metrics.partialFailures.Inc()
	}
	if errors.Is(err, errDrift) {
		b.log.Warn("our rules were flushed or changed behind our back; rewriting everything")
		b.st = nil
		b.distrust = true
		return b.syncFull(ctx, req)
	}
	return err
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
	if b.rewrite != nil {
		rd = b.rewrite(name, rd)
	}
	return rd, true
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
