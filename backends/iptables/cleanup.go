package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Cleanup removes, without a proxier, what the backend's proxiers of
// every flavour left in the namespace cfg.NetNS for the families of
// cfg.Families: every chain carrying cfg.ChainPrefix (default
// [DefaultChainPrefix]) and every rule that jumps to one, in every
// table, with the programs of each flavour installed (cfg.Mode is
// ignored: a node may have switched flavours). Other rules are not
// touched; in the nft flavour it then deletes the built-in chains and
// the tables it left empty, as [proxier.Backend.Cleanup] does. It is
// for --cleanup, or after switching a node to another backend; it
// succeeds when there is nothing to remove.
//
// The chains of a flavour and family that a live proxier holds are
// refused and kept: the error wraps "held by a running proxier" and
// names the holder. Without any iptables program nothing can have been
// left: the error then matches [proxier.ErrNotSupported].
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	n, err := newNames(cfg.ChainPrefix)
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	defer ns.Close()
	var errs []error
	found := false
	for _, f := range cfg.Families {
		for _, fl := range []iptables.Flavour{iptables.Legacy, iptables.NFT} {
			tools, err := iptables.FindTools(f, fl)
			if err != nil {
				continue // not installed: it cannot have left anything
			}
			found = true
			if err := cleanupFlavour(ctx, ns, cfg, n, tools); err != nil {
				errs = append(errs, fmt.Errorf("iptables: cleanup %s %s: %w", fl, f, err))
			}
		}
	}
	if !found {
		return &proxier.UnsupportedError{Backend: "iptables", What: "iptables programs (legacy or nft)"}
	}
	return errors.Join(errs...)
}

// cleanupFlavour removes the chains of one flavour and family, holding
// the lock a proxier of them holds (see NewBackend).
func cleanupFlavour(ctx context.Context, ns *netns.NS, cfg Config, n names, tools iptables.Tools) error {
	lock, err := ownerlock.Acquire(ns, ownerObject(tools.Flavour, tools.Family, cfg.ChainPrefix))
	if err != nil {
		return err
	}
	defer lock.Release()
	r, err := iptables.NewRunner(ctx, ns, tools, cfg.LockWait)
	if err != nil {
		return err
	}
	log := cfg.Logger.With("backend", "iptables", "family", tools.Family.String())
	return cleaner{n: n, log: log}.cleanupWith(ctx, r)
}

// ownerObject is what the proxier of a flavour, family and chain prefix
// locks (see internal/ownerlock).
func ownerObject(fl iptables.Flavour, f model.IPFamily, prefix string) string {
	return fmt.Sprintf("iptables %s %s %s", fl, f, prefix)
}

// Cleanup removes every chain carrying the backend's prefix and every rule
// that jumps to one, in every table, whoever created them, in the
// backend's flavour and in the other one when its programs are installed
// and hold some. Other rules are not touched. In the nft flavour it then
// deletes the built-in chains it left empty (policy ACCEPT, no rule) and
// the nf_tables tables left without any chain, as they were before the
// backend created them. Cleanup succeeds when there is nothing to remove.
func (b *backend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.run == nil {
		return errors.New("iptables: backend is closed")
	}
	b.stopCheck()
	b.st = nil
	c := cleaner{n: b.r.n, log: b.log}
	err := c.cleanupWith(ctx, b.run)
	other := iptables.Legacy
	if b.run.Tools().Flavour == iptables.Legacy {
		other = iptables.NFT
	}
	if tools, terr := iptables.FindTools(b.fam, other); terr == nil {
		if r, rerr := iptables.NewRunner(ctx, b.ns, tools, b.cfg.LockWait); rerr == nil {
			err = errors.Join(err, c.cleanupWith(ctx, r))
		}
	}
	if err != nil {
		return fmt.Errorf("iptables: cleanup: %w", err)
	}
	return nil
}

// cleaner removes the chains of one chain prefix.
type cleaner struct {
	n   names
	log *slog.Logger
}

// savedTable is what a *-save output says of one table.
type savedTable struct {
	name string
	// builtin maps the built-in chains to their policies.
	builtin map[string]string
	// ours are the chains with our prefix.
	ours []string
	// jumps are the rules ("-A ...") of other chains that jump to ours.
	jumps []string
	// others counts the rules of each other chain that stay.
	others map[string]int
}

// parseSave splits a *-save output into tables.
func (n names) parseSave(out []byte) []*savedTable {
	var tables []*savedTable
	var cur *savedTable
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		l := s.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			cur = &savedTable{name: l[1:], builtin: map[string]string{}, others: map[string]int{}}
			tables = append(tables, cur)
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l[1:])
			if len(f) < 2 {
				continue
			}
			switch {
			case n.owns(f[0]):
				cur.ours = append(cur.ours, f[0])
			case f[1] != "-":
				cur.builtin[f[0]] = f[1]
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) < 2 || n.owns(f[1]) {
				continue
			}
			if n.jumpsToOurs(f) {
				cur.jumps = append(cur.jumps, l)
			} else {
				cur.others[f[1]]++
			}
		}
	}
	return tables
}

// jumpsToOurs reports whether the rule's target (-j or -g) is our chain.
func (n names) jumpsToOurs(fields []string) bool {
	for i := 0; i+1 < len(fields); i++ {
		if (fields[i] == "-j" || fields[i] == "-g" || fields[i] == "--jump" || fields[i] == "--goto") && n.owns(fields[i+1]) {
			return true
		}
	}
	return false
}

// cleanupWith removes our chains and the jumps to them with runner r.
func (c cleaner) cleanupWith(ctx context.Context, r *iptables.Runner) error {
	// Listing every table, rather than naming one, does not make the
	// legacy kernel create it.
	out, err := r.Save(ctx, "")
	if err != nil {
		return err
	}
	var touched []*savedTable
	in := newInput(4096)
	for _, t := range c.n.parseSave(out) {
		if len(t.ours) == 0 && len(t.jumps) == 0 {
			continue
		}
		touched = append(touched, t)
		in.line("*", t.name)
		for _, j := range t.jumps {
			in.line("-D", strings.TrimPrefix(j, "-A"))
		}
		for _, c := range t.ours {
			in.declare(c)
		}
		for _, c := range t.ours {
			in.line("-X ", c)
		}
		in.line("COMMIT")
	}
	if len(touched) == 0 {
		return nil
	}
	if err := r.Restore(ctx, in.b); err != nil {
		return err
	}
	c.log.Info("removed chains and jumps", "flavour", string(r.Tools().Flavour), "tables", len(touched))
	if r.Tools().Flavour != iptables.NFT {
		// Legacy tables and built-in chains cannot be deleted.
		return nil
	}
	for _, t := range touched {
		for chain, policy := range t.builtin {
			if policy != "ACCEPT" || t.others[chain] > 0 {
				continue
			}
			// The kernel refuses to delete a chain that has rules, so
			// one added meanwhile is safe.
			if _, err := r.Command(ctx, "-t", t.name, "-X", chain); err != nil {
				c.log.Debug("built-in chain kept", "table", t.name, "chain", chain, "err", err)
			}
		}
		if _, err := r.DeleteTableIfEmpty(ctx, t.name); err != nil {
			return err
		}
	}
	return nil
}

// Close releases the namespace handle. The rules stay for a successor to
// adopt.
func (b *backend) Close() error {
	b.stopCheck()
	b.run = nil
	b.lock.Release()
	if b.ns == nil {
		return nil
	}
	err := b.ns.Close()
	b.ns = nil
	return err
}
