package iptables

import (
	"context"
	"slices"
	"time"

	"github.com/proxykit/proxykit/model"
)

// This file is the check of our chain set that follows an adopting first
// sync of the nft flavour.
//
// Adopting needs three things: the fingerprint rule says our chains hold
// what the sync would write, the jumps from the built-in chains are in
// place, and the chains of ours in the kernel are exactly those the sync
// would write (none missing, none left over). The first two cost a few
// milliseconds (iptables -S of the fingerprint chain and of each
// built-in chain; iptables-nft fetches only the chain it names). The
// third needs the list of the tables' chains, and the kernel's chain
// dump is quadratic in the family's chains: every ~32 KB datagram of the
// dump restarts its walk from the first chain (7.3 s for 332,000 empty
// chains in a quiet namespace, 20-23 s for the chains of 30,000 services
// of 10 endpoints in the restart test, on a shared 2-CPU machine). A
// GETCHAIN per wanted chain would find a missing chain in linear time,
// but not a left-over one.
//
// So the first sync of the nft flavour adopts on the fingerprint and the
// jumps alone, reports success, and lists the chains afterwards, beside
// the syncs that follow (a chainCheck). The sync that finds the check
// finished compares: a chain of ours the adopted state does not hold and
// the syncs since did not create (left over: an interrupted rewrite of
// another state, or a chain someone made), or one it holds that the
// kernel lacks (deleted behind our back), and the backend forgets its
// state (after looking each such chain up by name: the kernel may have
// changed since the dump passed it): that sync lists the chains again in
// its own time and adopts only
// if they match, else rewrites everything, deleting the left-over chains
// and writing the missing ones (what the first sync did before). So does
// a check that failed, or whose dumps a concurrent change interrupted
// each time: a failed check leads to the slower, complete path, never to
// trusting what was not checked.
//
// The trade-off: between the synced report and the sync after the check
// (the check takes as long as the dump, and the repair waits for the
// next sync, at the latest the periodic resync), a
// left-over chain of ours stays in the kernel. Nothing of ours jumps to
// it (the fingerprint covers every rule of our chains), so it carries no
// traffic. A missing chain means rules of ours were deleted with it (the
// kernel refuses to delete a chain a rule jumps to), which the
// fingerprint cannot see either way: the service ports whose rules were
// cut were already broken before the restart, and stay so until the
// repair, which comes later than when the first sync waited for the
// dump. A chain that a sync creates and deletes again during the dump
// (endpoints come and go) is not reported: the chains the listing
// found are looked up by name before the state is dropped. The legacy flavour has no chain dump: its first sync reads the
// tables with iptables-legacy-save, which lists every chain anyway, and
// checks the chain set before adopting, as before.

// checkAttempts bounds how often a check lists the chains again when a
// change interrupted the dump.
const checkAttempts = 3

// chainCheck is a listing of the kernel's chains running beside the
// syncs, compared with the chain set an adopting sync trusted.
type chainCheck struct {
	cancel context.CancelFunc
	// done is closed when the fields below are set.
	done chan struct{}
	// stray are the chains of ours the kernel holds beyond those
	// adopted, missing those adopted that it lacks, per table.
	stray, missing [numTables][]string
	// listed counts the chains of ours the kernel holds.
	listed int
	// interrupted is set when every dump was interrupted by a change.
	interrupted bool
	attempts    int
	err         error
	took        time.Duration
}

// ownChains returns the chains of ours a table holds after a rewrite of
// want: the fixed chains (with the fingerprint chain in nat) and the
// service ports' chains.
func (b *backend) ownChains(t table, want map[model.ServicePortName]*tableRules) map[string]bool {
	fixed, _ := b.r.fixedChains(t)
	m := make(map[string]bool, len(want)*4+len(fixed)+1)
	for _, c := range fixed {
		m[c.name] = true
	}
	if t == tNAT {
		m[b.r.n.fixed(chFingerprint)] = true
	}
	for _, tr := range want {
		for _, c := range tr.chains {
			m[c.name] = true
		}
	}
	return m
}

// startCheck starts listing the chains of the nft flavour beside the
// syncs, to compare them with want, which an adopting sync trusted
// without that list.
func (b *backend) startCheck(want [numTables]map[model.ServicePortName]*tableRules) {
	b.stopCheck()
	var expect [numTables]map[string]bool
	for t := range numTables {
		expect[t] = b.ownChains(t, want[t])
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &chainCheck{cancel: cancel, done: make(chan struct{})}
	list := b.listChains
	if list == nil {
		list = b.run.ChainsChecked
	}
	n, log := b.r.n, b.log
	go func() {
		defer close(c.done)
		start := time.Now()
		defer func() {
			c.took = time.Since(start)
			log.Info("listed our chains after adopting them", "chains", c.listed,
				"leftOver", len(slices.Concat(c.stray[:]...)), "missing", len(slices.Concat(c.missing[:]...)),
				"attempts", c.attempts, "interrupted", c.interrupted, "err", c.err, "duration", c.took)
		}()
		for c.attempts < checkAttempts {
			c.attempts++
			byTable, interrupted, _, err := list(ctx)
			if err != nil {
				c.err = err
				return
			}
			if c.interrupted = interrupted; interrupted {
				continue
			}
			for t := range numTables {
				seen := make(map[string]bool, len(expect[t]))
				for _, name := range byTable[t.String()] {
					if !n.owns(name) {
						continue
					}
					seen[name] = true
					if !expect[t][name] {
						c.stray[t] = append(c.stray[t], name)
					}
				}
				c.listed += len(seen)
				for name := range expect[t] {
					if !seen[name] {
						c.missing[t] = append(c.missing[t], name)
					}
				}
				slices.Sort(c.stray[t])
				slices.Sort(c.missing[t])
			}
			return
		}
	}()
	b.check = c
}

// stopCheck ends a running check and waits for it (the dump stops at its
// next datagram).
func (b *backend) stopCheck() {
	if b.check != nil {
		b.check.cancel()
		<-b.check.done
		b.check = nil
	}
}

// collectCheck looks at a check that has finished, if any. When it found
// a chain of ours left over or missing, failed, or could not get a dump
// no change interrupted, the state is forgotten: the sync lists the
// chains itself and adopts only if they match, else rewrites everything.
// A chain created or deleted by the syncs since the adoption is not held
// against the kernel, and what the listing found is looked up again by
// name (GETCHAIN, up to maxConfirm chains) before it is believed.
func (b *backend) collectCheck(ctx context.Context) {
	c := b.check
	if c == nil {
		return
	}
	select {
	case <-c.done:
	default:
		return
	}
	b.check = nil
	if b.st == nil {
		return // the next sync lists the chains anyway
	}
	switch {
	case c.err != nil:
		b.log.Warn("could not list our chains to check the adopted ones; listing them again before trusting them", "err", c.err, "duration", c.took)
	case c.interrupted:
		b.log.Warn("every listing of our chains was interrupted by a change; listing them again before trusting them", "attempts", c.attempts, "duration", c.took)
	default:
		var stray, missing []string
		for t := range numTables {
			now := b.ownChains(t, b.st.svcs[t])
			var cands []string
			for _, name := range c.stray[t] {
				if !now[name] {
					cands = append(cands, name)
				}
			}
			for _, name := range c.missing[t] {
				if now[name] {
					cands = append(cands, name)
				}
			}
			// Confirmed one by one: a chain a sync created and deleted
			// again while the dump ran (or deleted and created) is
			// none of these now. Only this goroutine writes our
			// chains.
			exist, err := b.chainsExist(ctx, t, cands)
			if err != nil {
				b.log.Warn("could not look the chains the check found up; listing them again before trusting them", "err", err)
				stray = append(stray, "?")
				break
			}
			for _, name := range cands {
				switch {
				case now[name] && (exist == nil || !exist[name]):
					missing = append(missing, t.String()+" "+name)
				case !now[name] && (exist == nil || exist[name]):
					stray = append(stray, t.String()+" "+name)
				}
			}
		}
		if len(stray) == 0 && len(missing) == 0 {
			b.log.Info("checked the adopted chains: as expected", "chains", c.listed, "duration", c.took)
			return
		}
		b.log.Warn("the adopted chains are not those we would write; rewriting", "leftOver", len(stray), "missing", len(missing),
			"examples", slices.Concat(stray[:min(3, len(stray))], missing[:min(3, len(missing))]), "duration", c.took)
	}
	b.st = nil
	b.listFirst = true
}

// maxConfirm bounds the chains a check's verdict is confirmed for, one
// GETCHAIN each; past it, the sync lists them all again.
const maxConfirm = 1000

// chainsExist reports which of chains table t holds; nil (none
// confirmed) when there are too many of them or no kernel to ask.
func (b *backend) chainsExist(ctx context.Context, t table, chains []string) (map[string]bool, error) {
	if len(chains) == 0 || len(chains) > maxConfirm || b.run == nil {
		return nil, nil
	}
	exist, ok, err := b.run.ChainsExist(ctx, t.String(), chains)
	if !ok {
		return nil, err
	}
	return exist, err
}

// chainLister lists the chains of each table, as
// iptables.Runner.ChainsChecked does.
type chainLister func(ctx context.Context) (byTable map[string][]string, interrupted, ok bool, err error)
