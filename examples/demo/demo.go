package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/static"
	"github.com/proxykit/proxykit/sandbox"
)

//go:embed services.yaml
var bundledServices []byte

// options are the command line.
type options struct {
	backend  string
	services string // empty: the bundled file
	watch    bool
	keep     bool
	remove   string
	requests int
	raw      bool
	verbose  bool
}

// Timeouts of the demo's steps.
const (
	syncTimeout     = 30 * time.Second
	stopTimeout     = 10 * time.Second
	watchInterval   = 500 * time.Millisecond
	settleDelay     = 300 * time.Millisecond // lets a burst of file changes coalesce
	cleanupDeadline = 30 * time.Second
)

// run is the demo: out receives the report, logw the proxier's logs and
// warnings. It returns when done, or soon after ctx is cancelled, with
// the sandbox torn down (or detached with --keep).
func run(ctx context.Context, o options, out, logw io.Writer) (err error) {
	if o.remove != "" {
		names, err := sandbox.Remove(o.remove)
		for _, n := range names {
			fmt.Fprintln(out, "removed namespace", n)
		}
		if err == nil && len(names) == 0 {
			err = fmt.Errorf("no namespace of sandbox %s in %s", o.remove, sandbox.NetNSDir)
		}
		return err
	}
	be, err := lookupBackend(o.backend)
	if err != nil {
		return err
	}
	if o.requests <= 0 {
		o.requests = defaultRequests
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))

	// The static source reads a file; the bundled one is copied to a
	// temporary file, which --watch lets the user edit.
	path, label := o.services, o.services
	if path == "" {
		dir, err := os.MkdirTemp("", "proxykit-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path, label = filepath.Join(dir, "services.yaml"), "the bundled services.yaml"
		if err := os.WriteFile(path, bundledServices, 0o644); err != nil {
			return err
		}
	}
	if _, err := static.Load(path); err != nil {
		var de *static.DocumentError
		if !errors.As(err, &de) {
			return err
		}
		fmt.Fprintf(logw, "demo: warning: %v (skipped)\n", err)
	}

	start := time.Now()
	sb, err := sandbox.New(ctx, sandbox.Options{})
	if errors.Is(err, sandbox.ErrNotPrivileged) {
		return fmt.Errorf("%w\nThe demo creates network namespaces; run it as root: sudo go run ./examples/demo", err)
	}
	if err != nil {
		return err
	}
	defer func() {
		if o.keep {
			err = errors.Join(err, sb.Keep())
			fmt.Fprintf(out, "\nKept sandbox %s: its namespaces are %s/pk-%s-*, e.g.\n"+
				"  sudo ip netns exec pk-%s-node1 nft list ruleset\n"+
				"Remove them with: sudo go run ./examples/demo --remove %s\n",
				sb.ID, sandbox.NetNSDir, sb.ID, sb.ID, sb.ID)
			return
		}
		err = errors.Join(err, sb.Close())
	}()
	if err := quietRedirects(sb.Node1); err != nil {
		return err
	}
	d := newDemo(sb)
	fmt.Fprintf(out, "proxykit demo: backend %s, sandbox pk-%s built in %v\n", o.backend, sb.ID, time.Since(start).Round(time.Millisecond))
	d.describe(out)

	cfg := proxier.Config{
		NetNS:           sb.Node1.NetNSPath(),
		NodeName:        sb.Node1.Name,
		Families:        []model.IPFamily{model.IPv4, model.IPv6},
		ClusterCIDRs:    sb.PodNetworks(),
		MinSyncInterval: 100 * time.Millisecond,
		Logger:          log,
	}
	p, release, err := be.start(cfg, sb)
	if err != nil {
		return fmt.Errorf("backend %s: %w", o.backend, err)
	}
	if release != nil {
		defer func() { err = errors.Join(err, release()) }()
	}
	v := newView(p)
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- p.Run(runCtx) }()
	src := &static.Source{Path: path, Logger: log}
	if o.watch {
		src.Watch = watchInterval
	}
	go func() { done <- src.Run(runCtx, v) }()
	defer func() {
		stopRun()
		for range 2 {
			select {
			case e := <-done:
				err = errors.Join(err, e)
			case <-time.After(stopTimeout):
				err = errors.Join(err, errors.New("the proxier did not stop"))
			}
		}
		if !o.keep {
			cctx, cancel := context.WithTimeout(context.Background(), cleanupDeadline)
			err = errors.Join(err, p.Cleanup(cctx))
			cancel()
		}
		err = errors.Join(err, p.Close())
	}()

	fmt.Fprintf(out, "services: %s\n", label)
	gen, err := d.round(ctx, out, v, o)
	if err != nil {
		return err
	}
	if err := showProgrammed(ctx, out, be, d, o.raw); err != nil {
		fmt.Fprintf(out, "  (could not list it: %v)\n", err)
	}
	if !o.watch {
		return nil
	}
	fmt.Fprintf(out, "\nWatching %s: edit it and the services are reprogrammed and probed again. Ctrl-C to stop.\n", path)
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\nInterrupted; tearing the sandbox down.")
			return nil
		case <-v.changed:
		}
		// Let the rest of the file's events arrive.
		select {
		case <-ctx.Done():
			continue
		case <-time.After(settleDelay):
		}
		if v.generation() == gen {
			continue // already probed
		}
		fmt.Fprintf(out, "\n--- %s changed at %s ---\n", filepath.Base(path), time.Now().Format(time.TimeOnly))
		if gen, err = d.round(ctx, out, v, o); err != nil {
			return err
		}
	}
}

// round waits for the proxier to program every event so far, then
// probes every service and prints the results. It returns the
// generation of the view it probed.
func (d *demo) round(ctx context.Context, out io.Writer, v *view, o options) (int, error) {
	start := time.Now()
	var (
		svcs  []*v1.Service
		bySvc map[string][]*discoveryv1.EndpointSlice
		gen   int
	)
	for {
		before := v.generation()
		fctx, cancel := context.WithTimeout(ctx, syncTimeout)
		err := v.Flush(fctx)
		cancel()
		if ctx.Err() != nil {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("the proxier did not program the services within %v: %w", syncTimeout, err)
		}
		// Probe only what was flushed: if an event came meanwhile, flush
		// again.
		if svcs, bySvc, gen = v.snapshot(); gen == before {
			break
		}
	}
	fmt.Fprintf(out, "programmed %d services in %v; sending %d requests per client and address:\n", len(svcs), roundDuration(time.Since(start)), o.requests)
	reports := d.plan(svcs, bySvc)
	d.probe(ctx, reports, o.requests)
	d.print(out, reports)
	fmt.Fprintln(out, "\n(source seen: the address the pod saw. The node masquerades service traffic from itself and from\n outside; pods keep their address, and so does outside traffic to an externalTrafficPolicy Local service.)")
	return gen, nil
}

// describe prints the sandbox's hosts.
func (d *demo) describe(w io.Writer) {
	t := d.sb
	pods := func(n *sandbox.Node) string {
		var b bytes.Buffer
		for i, p := range n.Pods {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %s", p.Name, p.IPv4)
		}
		return b.String()
	}
	fmt.Fprintf(w, "  node1   %s, external %s: runs the proxier; pods %s\n", t.Node1.IPv4, t.Node1.ExternalIPv4, pods(t.Node1))
	fmt.Fprintf(w, "  node2   %s: pods %s\n", t.Node2.IPv4, pods(t.Node2))
	fmt.Fprintf(w, "  client  %s: outside the cluster, reaches node ports on %s\n", t.Client.IPv4, t.Node1.ExternalIPv4)
}

// showProgrammed prints what the backend programmed.
func showProgrammed(ctx context.Context, w io.Writer, be backend, d *demo, raw bool) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l := be.show
	if raw && be.raw != nil {
		l = be.raw
	}
	if l == nil {
		fmt.Fprintf(w, "\n(the demo cannot list what the %s backend programmed yet)\n", be.name)
		return nil
	}
	return l(sctx, w, d.sb.Node1, d.name)
}

// quietRedirects stops node1 from sending ICMP redirects. The sandbox's
// pods hang off routed veths, so a pod reaching itself through a service
// (hairpin) is forwarded out of the interface it came in on, and the
// redirect the kernel then sends uses up the ICMP rate-limit tokens of
// that pod: the "port unreachable" of a later reject would be
// suppressed and the pod would see a timeout instead of a refusal.
func quietRedirects(node *sandbox.Node) error {
	return node.Do(func() error {
		confs, err := filepath.Glob("/proc/sys/net/ipv4/conf/*/send_redirects")
		if err != nil {
			return err
		}
		for _, c := range confs {
			if err := os.WriteFile(c, []byte("0"), 0); err != nil {
				return fmt.Errorf("%s: %w", c, err)
			}
		}
		return nil
	})
}

// roundDuration rounds d for printing, keeping sub-millisecond times
// readable.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
