package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/proxykit/proxykit/internal/iptables"
)

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
	b.st = nil
	err := b.cleanupWith(ctx, b.run)
	other := iptables.Legacy
	if b.run.Tools().Flavour == iptables.Legacy {
		other = iptables.NFT
	}
	if tools, terr := iptables.FindTools(b.fam, other); terr == nil {
		if r, rerr := iptables.NewRunner(ctx, b.ns, tools, b.cfg.LockWait); rerr == nil {
			err = errors.Join(err, b.cleanupWith(ctx, r))
		}
	}
	if err != nil {
		return fmt.Errorf("iptables: cleanup: %w", err)
	}
	return nil
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
func (b *backend) parseSave(out []byte) []*savedTable {
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
			case b.r.n.owns(f[0]):
				cur.ours = append(cur.ours, f[0])
			case f[1] != "-":
				cur.builtin[f[0]] = f[1]
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) < 2 || b.r.n.owns(f[1]) {
				continue
			}
			if b.jumpsToOurs(f) {
				cur.jumps = append(cur.jumps, l)
			} else {
				cur.others[f[1]]++
			}
		}
	}
	return tables
}

// jumpsToOurs reports whether the rule's target (-j or -g) is our chain.
func (b *backend) jumpsToOurs(fields []string) bool {
	for i := 0; i+1 < len(fields); i++ {
		if (fields[i] == "-j" || fields[i] == "-g" || fields[i] == "--jump" || fields[i] == "--goto") && b.r.n.owns(fields[i+1]) {
			return true
		}
	}
	return false
}

// cleanupWith removes our chains and the jumps to them with runner r.
func (b *backend) cleanupWith(ctx context.Context, r *iptables.Runner) error {
	// Listing every table, rather than naming one, does not make the
	// legacy kernel create it.
	out, err := r.Save(ctx, "")
	if err != nil {
		return err
	}
	var touched []*savedTable
	in := newInput(4096)
	for _, t := range b.parseSave(out) {
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
	b.log.Info("removed chains and jumps", "flavour", string(r.Tools().Flavour), "tables", len(touched))
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
				b.log.Debug("built-in chain kept", "table", t.name, "chain", chain, "err", err)
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
	b.run = nil
	b.lock.Release()
	if b.ns == nil {
		return nil
	}
	err := b.ns.Close()
	b.ns = nil
	return err
}
