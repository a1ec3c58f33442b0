package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/internal/nodesetup"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/informer"
)

// This file shows what the proxier programmed: /debug/services on the
// metrics server, the inspect subcommand, and --dry-run.

// debugServicesHandler serves /debug/services: the proxier's report
// ([proxier.Engine.Inspect]), read back from the kernel, as text, or as
// JSON with ?format=json or an Accept header asking for JSON.
// ?plan=true serves the plan instead ([proxier.Engine.Plan]): what the
// next sync programs, without reading the kernel.
func debugServicesHandler(rep proxier.Reporter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		read := rep.Inspect
		if r.URL.Query().Get("plan") == "true" {
			read = rep.Plan
		}
		report, err := read(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(report)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = report.WriteText(w)
	})
}

// inspectUsage is the subcommand's help.
const inspectUsage = `usage: proxy inspect [--server URL] [-o text|json] [--plan]
       proxy inspect --kernel [-o text|json] [kube-proxy flags: --proxy-mode, --config, --netns, ...]

Shows what the proxier programmed, read back from the kernel. By default it
asks the running proxy's metrics server (/debug/services): every service
port's frontends, what they should be beside what the kernel holds, and the
differences. --plan shows what the next sync programs instead. --kernel
reads the kernel itself, without a running proxy: the frontends of the
mode's objects (--proxy-mode, names from --config), unnamed.
`

// runInspect runs the inspect subcommand.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, inspectUsage) }
	server := fs.String("server", "", "the proxy's metrics server (default: http:// and the --metrics-bind-address of the other flags, 127.0.0.1:10249)")
	output := fs.String("o", "text", "output format: text or json")
	plan := fs.Bool("plan", false, "show what the next sync programs instead of what the kernel holds")
	kernel := fs.Bool("kernel", false, "read the kernel directly, without a running proxy")
	// The inspect flags come first; the rest are the daemon's.
	var own, rest []string
	for _, a := range args {
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		if fs.Lookup(name) != nil && strings.HasPrefix(a, "-") {
			own = append(own, a)
		} else if len(own) > 0 && !strings.HasPrefix(a, "-") && len(rest) == 0 && needsValue(fs, own[len(own)-1]) {
			own = append(own, a)
		} else {
			rest = append(rest, a)
		}
	}
	if err := fs.Parse(own); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return err
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("inspect: -o %q: want text or json", *output)
	}
	s, err := resolve(rest, stderr)
	if err != nil {
		return err
	}
	if *kernel {
		return inspectKernel(ctx, s, *output, stdout)
	}
	url := *server
	if url == "" {
		addr := s.cfg.MetricsBindAddress
		if addr == "" {
			return errors.New("inspect: no metrics server: --metrics-bind-address is empty; give --server or --kernel")
		}
		url = "http://" + strings.Replace(listenAddr(addr), "0.0.0.0:", "127.0.0.1:", 1)
	}
	url = strings.TrimSuffix(url, "/") + "/debug/services?format=" + *output
	if *plan {
		url += "&plan=true"
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("inspect: %w (is the proxy running? --kernel reads the kernel without it)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("inspect: %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	_, err = io.Copy(stdout, resp.Body)
	return err
}

// needsValue reports whether flag arg (of fs) takes the next argument as
// its value: a non-boolean flag given without "=".
func needsValue(fs *flag.FlagSet, arg string) bool {
	if strings.Contains(arg, "=") {
		return false
	}
	f := fs.Lookup(strings.TrimLeft(arg, "-"))
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// kernelFamily is one family of what inspect --kernel read.
type kernelFamily struct {
	Family    string                 `json:"family"`
	Frontends []proxier.FrontendJSON `json:"frontends"`
}

// inspectKernel reads the mode's objects back from the kernel with
// backends.Inspect and writes their frontends.
func inspectKernel(ctx context.Context, s *settings, output string, stdout io.Writer) error {
	cfg := s.cleanupConfig()
	mode := string(s.cfg.Mode)
	got, err := backends.Inspect(ctx, mode, cfg)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	var out []kernelFamily
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		fs, ok := got[f]
		if !ok {
			continue
		}
		kf := kernelFamily{Family: f.String(), Frontends: []proxier.FrontendJSON{}}
		for _, fr := range fs {
			kf.Frontends = append(kf.Frontends, fr.JSON())
		}
		slices.SortFunc(kf.Frontends, func(a, b proxier.FrontendJSON) int { return strings.Compare(a.Frontend, b.Frontend) })
		out = append(out, kf)
	}
	if output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"backend": mode, "families": out})
	}
	fmt.Fprintf(stdout, "backend %s (read from the kernel, without a proxy: service ports unnamed)\n", mode)
	for _, kf := range out {
		fmt.Fprintf(stdout, "\n%s: %d frontends\n", kf.Family, len(kf.Frontends))
		for _, f := range kf.Frontends {
			fmt.Fprintf(stdout, "  %s\n", f)
		}
	}
	return nil
}

// dryRun is the run of --dry-run: it reports the node settings the
// configuration would change and, once the informers delivered the
// initial lists, what the mode's backend would program, on stdout; it
// changes nothing, neither the node's settings nor its dataplane.
func (d *daemon) dryRun(ctx context.Context, cfg backends.Config) error {
	changes, err := nodesetup.Plan(ctx, d.s.nodeSetupConfig(cfg))
	if err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "node settings (%d changes):\n", len(changes))
	for _, c := range changes {
		fmt.Fprintf(d.stdout, "  %s\n", c)
	}
	planner, err := proxier.NewPlanner(cfg.Config, string(d.s.cfg.Mode))
	if err != nil {
		return err
	}
	defer planner.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- informer.Run(ctx, d.client, planner, informer.Config{NodeName: d.nodeName, Resync: d.s.cfg.ConfigSyncPeriod.Duration})
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		report, err := planner.Plan(ctx)
		if err == nil {
			fmt.Fprintln(d.stdout)
			return report.WriteText(d.stdout)
		}
		if !errors.Is(err, proxier.ErrNotSynced) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return fmt.Errorf("informers stopped before the initial lists: %w", err)
		case <-tick.C:
		}
	}
}
