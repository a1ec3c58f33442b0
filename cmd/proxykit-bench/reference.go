package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
)

// loader is how a kube-proxy reference loads a rule set: the program and
// its arguments.
type loader struct {
	argv []string
}

func (r *runner) loader(name string) loader {
	// kube-proxy's own invocation is iptables-restore -w 5 -W 100000
	// --noflush --counters.
	ipt := []string{"-w", "5", "--noflush", "--counters"}
	switch name {
	case refNFT:
		return loader{argv: []string{"nft", "-f", "-"}}
	case refIPTablesNFT:
		return loader{argv: append([]string{"iptables-nft-restore"}, ipt...)}
	case refIPTablesLegacy:
		return loader{argv: append([]string{"iptables-legacy-restore"}, ipt...)}
	}
	return loader{argv: append([]string{"iptables-restore"}, ipt...)}
}

// load runs the loader on script (a file) in ns, in a load child, and
// returns how long it ran and its peak resident set in kB.
func (r *runner) load(ctx context.Context, ns *testnet.NS, l loader, script string) (time.Duration, int64, error) {
	ch, err := r.startChild(ctx, roleLoad, l.argv[0], loadParams{NetNS: ns.Path(), Argv: l.argv, Input: script})
	if err != nil {
		return 0, 0, err
	}
	defer ch.kill()
	res, err := ch.read()
	if err != nil {
		return 0, 0, err
	}
	if err := ch.wait(); err != nil {
		return 0, 0, err
	}
	return time.Duration(res.LoadNS), res.LoadRSSKB, nil
}

// referenceCase measures a kube-proxy layout at one size: the generated
// rule set loaded whole, the transactions of endpoint changes, and
// connections through it.
func (r *runner) referenceCase(ctx context.Context, c *Case) {
	cctx, cancel := r.caseContext(ctx)
	defer cancel()
	l := r.loader(c.Name)
	if _, err := exec.LookPath(l.argv[0]); err != nil {
		c.Status, c.Reason = "unsupported", fmt.Sprintf("no %s installed", l.argv[0])
		return
	}
	t, err := r.topology()
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	defer func() {
		r.flushRuleset(t)
		if err := t.Close(); err != nil {
			r.logf("teardown: %v", err)
		}
	}()
	dir, err := os.MkdirTemp("", "proxykit-bench-")
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	defer os.RemoveAll(dir)
	write := func(name, s string) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, []byte(s), 0o600)
	}

	// The measured service sits in the middle of the others: in the
	// iptables layout its rule is halfway down KUBE-SERVICES, which
	// every new connection walks.
	svcs := scale.Services(c.Size.Services, c.Size.Endpoints)
	eps, err := targetEndpoints(cctx, t, c.Size)
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	target := scale.Target("node1", eps...)
	mid := len(svcs) / 2
	withTarget := func() []scale.Service {
		all := make([]scale.Service, 0, len(svcs)+1)
		all = append(all, svcs[:mid]...)
		all = append(all, target)
		return append(all, svcs[mid:]...)
	}
	nft := c.Name == refNFT
	var script string
	if nft {
		script = scale.KubeProxyNFT(withTarget())
	} else {
		script = scale.KubeProxyIPTables(withTarget())
	}
	c.RuleSetMB = float64(len(script)) / 1e6
	full, err := write("full", script)
	script = ""
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	d, rss, err := r.load(cctx, t.Node1.NS, l, full)
	if err != nil {
		r.fail(ctx, cctx, c, fmt.Errorf("full load: %w", err))
		return
	}
	os.Remove(full)
	c.SyncSeconds, c.PeakRSSMB = d.Seconds(), float64(rss)/1024

	var changes []int64
	end := time.Now().Add(r.o.ChangesTime)
	for k := range r.o.Changes {
		if k >= 5 && time.Now().After(end) {
			break
		}
		idx, upd := scale.Change(svcs, k)
		old := svcs[idx]
		svcs[idx] = upd
		var tx string
		if nft {
			tx = scale.KubeProxyNFTChange(old, upd)
		} else {
			tx = scale.KubeProxyIPTablesChange(withTarget(), old, upd)
		}
		f, err := write(fmt.Sprintf("change-%d", k), tx)
		if err != nil {
			c.Status, c.Reason = "error", oneLine(err.Error())
			return
		}
		d, _, err := r.load(cctx, t.Node1.NS, l, f)
		if err != nil {
			r.fail(ctx, cctx, c, fmt.Errorf("endpoint change %d: %w", k, err))
			return
		}
		os.Remove(f)
		changes = append(changes, d.Nanoseconds())
	}
	c.Change = stats(changes, 1e6)

	if err := r.connect(cctx, c, t, ""); err != nil {
		r.fail(ctx, cctx, c, fmt.Errorf("connect: %w", err))
		return
	}
	c.Status = "ok"
}
