package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/cmd/proxykit-bench/internal/plot"
)

// Plot files, in Options.PlotDir.
const (
	plotSync    = "sync-time.svg"
	plotChange  = "change-latency.svg"
	plotConnect = "connect-latency.svg"
	// The same over endpoints per service, at 10 services (big
	// services, issue #22): written when a run has such sizes.
	plotBigSync    = "big-sync-time.svg"
	plotBigChange  = "big-change-latency.svg"
	plotBigConnect = "big-connect-latency.svg"
	resultsJSON    = "results.json"
)

// write writes the results, the plots and the report.
func write(rep *Report, o Options) error {
	return writeOutputs(o, resultsJSON, rep,
		func(dir string) error { return writePlots(rep, dir) },
		func(old string) string { return composeReport(markdown(rep, o), "", old) })
}

// writeOutputs writes results as JSON file name and its plots into
// o.PlotDir, and o.Out as section returns it from the report there
// before (empty when there was none); an empty o.PlotDir or o.Out skips
// its part.
func writeOutputs(o Options, name string, results any, plots func(dir string) error, section func(old string) string) error {
	if o.PlotDir != "" {
		if err := os.MkdirAll(o.PlotDir, 0o755); err != nil {
			return err
		}
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.PlotDir, name), append(b, '\n'), 0o644); err != nil {
			return err
		}
		if err := plots(o.PlotDir); err != nil {
			return err
		}
	}
	if o.Out != "" {
		old, err := os.ReadFile(o.Out)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := os.WriteFile(o.Out, []byte(section(string(old))), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// handWritten marks where the hand-written sections of the report begin
// (figures of tests the tool does not run): everything from this line on
// is kept when the report is written again.
const handWritten = "<!-- hand-written sections: proxykit-bench keeps everything from this line on -->"

// keepHandWritten returns the report md followed by the hand-written
// sections of the previous report old, if it had any.
func keepHandWritten(md, old string) string {
	i := strings.Index(old, handWritten)
	if i < 0 {
		return md
	}
	return strings.TrimRight(md, "\n") + "\n\n" + old[i:]
}

// rewrite writes the report and the plots again from a results file,
// e.g. after a change of their layout, without measuring anything: the
// scale run's results.json or the data-path mode's datapath.json.
func rewrite(results string, o Options) error {
	b, err := os.ReadFile(results)
	if err != nil {
		return err
	}
	var kind struct{ Kind string }
	json.Unmarshal(b, &kind)
	if kind.Kind == "datapath" {
		var rep DatapathReport
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", results, err)
		}
		if o.Note != "" {
			rep.Machine.Note = o.Note
		}
		return writeDatapath(&rep, o)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", results, err)
	}
	if o.Note != "" {
		rep.Machine.Note = o.Note
	}
	return write(&rep, o)
}

// dataplanes returns the labels of the cases' dataplanes in run order.
func dataplanes(rep *Report) []string {
	var out []string
	for _, c := range rep.Cases {
		if !slices.Contains(out, c.Label) {
			out = append(out, c.Label)
		}
	}
	return out
}

// line returns the points of one dataplane at the sizes with 10
// endpoints per service, with y taken from each measured case.
// axis is the x axis of a plot: which sizes it shows, and where.
type axis struct {
	label string
	match func(Size) bool
	x     func(Size) float64
}

var (
	// servicesAxis: services of 10 endpoints each.
	servicesAxis = axis{"services (10 endpoints each)",
		func(s Size) bool { return s.Endpoints == 10 }, func(s Size) float64 { return float64(s.Services) }}
	// endpointsAxis: endpoints per service, 10 services.
	endpointsAxis = axis{"endpoints per service (10 services)",
		func(s Size) bool { return s.Services == 10 }, func(s Size) float64 { return float64(s.Endpoints) }}
)

func line(rep *Report, label string, ax axis, y func(*Case) float64) (xs, ys []float64) {
	for _, c := range rep.Cases {
		if c.Label == label && c.ok() && ax.match(c.Size) {
			if v := y(c); v > 0 {
				xs, ys = append(xs, ax.x(c.Size)), append(ys, v)
			}
		}
	}
	return xs, ys
}

func writePlots(rep *Report, dir string) error {
	labels := dataplanes(rep)
	type spec struct {
		file, title, ylabel string
		ax                  axis
		median, p99         func(*Case) float64
	}
	sync := func(c *Case) float64 { return c.SyncSeconds }
	change := [2]func(*Case) float64{func(c *Case) float64 { return c.Change.Median }, func(c *Case) float64 { return c.Change.P99 }}
	connect := [2]func(*Case) float64{func(c *Case) float64 { return c.Connect.Median }, func(c *Case) float64 { return c.Connect.P99 }}
	const changeTitle = "One endpoint change, event to kernel: median (solid), p99 (dashed)"
	const connectTitle = "TCP connect through a cluster IP from a pod: median (solid), p99 (dashed)"
	specs := []spec{
		{plotSync, "First full sync (services × 10 endpoints)", "seconds", servicesAxis, sync, nil},
		{plotChange, changeTitle, "milliseconds", servicesAxis, change[0], change[1]},
		{plotConnect, connectTitle, "microseconds", servicesAxis, connect[0], connect[1]},
		{plotBigSync, "First full sync (10 services × endpoints)", "seconds", endpointsAxis, sync, nil},
		{plotBigChange, changeTitle, "milliseconds", endpointsAxis, change[0], change[1]},
		{plotBigConnect, connectTitle, "microseconds", endpointsAxis, connect[0], connect[1]},
	}
	for _, s := range specs {
		ch := plot.Chart{Title: s.title, XLabel: s.ax.label, YLabel: s.ylabel}
		for i, l := range labels {
			xs, ys := line(rep, l, s.ax, s.median)
			if len(xs) == 0 {
				continue
			}
			ch.Series = append(ch.Series, plot.Series{Name: l, X: xs, Y: ys, Style: i})
			if s.p99 != nil {
				xs, ys := line(rep, l, s.ax, s.p99)
				ch.Series = append(ch.Series, plot.Series{X: xs, Y: ys, Style: i, Dashed: true})
			}
		}
		if len(ch.Series) == 0 {
			continue
		}
		if err := plot.SVG(filepath.Join(dir, s.file), ch); err != nil {
			return err
		}
	}
	return nil
}

// markdown renders the report.
func markdown(rep *Report, o Options) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	m := rep.Machine
	p("# Benchmarks\n\n")
	p("Scale and comparison figures of proxykit's dataplane backends against kube-proxy's\n")
	p("nftables and iptables layouts, measured by [`cmd/proxykit-bench`](cmd/proxykit-bench) in fresh\n")
	p("network namespaces on one machine. This file, the plots and the raw figures\n")
	plotRel := o.PlotDir
	if o.Out != "" && o.PlotDir != "" {
		if rel, err := filepath.Rel(filepath.Dir(o.Out), o.PlotDir); err == nil {
			plotRel = filepath.ToSlash(rel)
		}
	}
	link := func(f string) string {
		if plotRel == "." || plotRel == "" {
			return f
		}
		return plotRel + "/" + f
	}
	if o.PlotDir != "" {
		p("([`%s`](%s)) are what the command below wrote:\n\n", link(resultsJSON), link(resultsJSON))
	} else {
		p("are what the command below wrote:\n\n")
	}
	p("    %s\n\n", rep.Command)
	p("The tool is a Go module of its own, so that the SDK's go.mod does not require its\n")
	p("plotting library; from the repository's root, `%s && %s [flags]`\n", buildCommand, runCommand)
	p("runs it. `--smoke` runs 100 services only; its test (`go test ./...` in\n")
	p("`cmd/proxykit-bench`, which `hack/test.sh` runs) does that as root.\n")
	p("`--from results.json` writes this file and the plots again without measuring.\n")
	p("`--datapath` measures packets rather than programming: its figures are in\n")
	p("[their own section](#%s) below, which the runs above keep.\n\n", datapathAnchor)

	p("## Machine\n\n")
	p("- Run %s, %s in all.\n", rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Finished.Sub(rep.Started).Round(time.Second))
	p("- CPU: %s, %d logical CPUs; %.1f GB memory.\n", m.CPU, m.CPUs, m.MemoryGB)
	p("- Kernel %s; %s; %s.\n", m.Kernel, m.OS, m.Go)
	p("- %s; %s.\n", m.NFT, m.IPTables)
	p("- Load average (1, 5, 15 min) at the start: %s; at the end: %s.\n", m.LoadStart, m.LoadEnd)
	if m.Source != "" {
		p("- Source: `%s` (git describe).\n", m.Source)
	}
	if m.Note != "" {
		p("- %s\n", m.Note)
	}
	p("\n")

	p("## Results\n\n")
	sizes := []Size{}
	for _, c := range rep.Cases {
		if !slices.Contains(sizes, c.Size) {
			sizes = append(sizes, c.Size)
		}
	}
	slices.SortStableFunc(sizes, func(a, b Size) int {
		if a.Endpoints != b.Endpoints {
			return a.Endpoints - b.Endpoints
		}
		return a.Services - b.Services
	})
	var notes []string
	note := func(s string) int {
		if i := slices.Index(notes, s); i >= 0 {
			return i + 1
		}
		notes = append(notes, s)
		return len(notes)
	}
	for _, sz := range sizes {
		p("### %s services × %s endpoints\n\n", thousands(sz.Services), thousands(sz.Endpoints))
		p("| dataplane | first full sync | peak RSS | endpoint change: median / p99 (n) | connect: median / p99 |\n")
		p("| --- | ---: | ---: | ---: | ---: |\n")
		for _, c := range rep.Cases {
			if c.Size != sz {
				continue
			}
			if !c.ok() {
				what := "not measured"
				switch c.Status {
				case "cut":
					what = "cut"
				case "error":
					what = "failed"
				case "unsupported":
					what = "not measured here"
				}
				p("| %s | %s [%d] | — | — | — |\n", c.Label, what, note(c.Reason))
				continue
			}
			rss := fmt.Sprintf("%.0f MB", c.PeakRSSMB)
			if c.Kind == "reference" {
				rss += " (loader)"
			}
			p("| %s | %s | %s | %s / %s ms (%d) | %s / %s µs |\n", c.Label, seconds(c.SyncSeconds), rss,
				num(c.Change.Median), num(c.Change.P99), c.Change.N, num(c.Connect.Median), num(c.Connect.P99))
		}
		p("\n")
	}
	if len(notes) > 0 {
		p("Not measured:\n\n")
		for i, n := range notes {
			p("%d. %s\n", i+1, n)
		}
		p("\n")
	}

	if o.PlotDir != "" {
		p("## Plots\n\n")
		p("Services × 10 endpoints; 5,000 × 50 is in the tables only. Both axes are logarithmic.\n\n")
		if _, err := os.Stat(filepath.Join(o.PlotDir, plotBigChange)); err == nil {
			p("The big-* plots: 10 services of more and more endpoints each.\n\n")
		}
		for _, f := range []string{plotSync, plotChange, plotConnect, plotBigSync, plotBigChange, plotBigConnect} {
			if _, err := os.Stat(filepath.Join(o.PlotDir, f)); err == nil {
				p("![%s](%s)\n\n", strings.TrimSuffix(f, ".svg"), link(f))
			}
		}
	}

	p("## What is measured\n\n")
	p("Every case (one dataplane at one size) builds a fresh set of network namespaces\n")
	p("(`internal/testnet`: a node, three pods routed behind it, a second node, a client, an\n")
	p("uplink), programs the node's namespace and tears everything down afterwards. Only IPv4.\n")
	p("The services are ClusterIP TCP services, every tenth with a node port, their endpoints in\n")
	p("EndpointSlices of at most 100 (as the EndpointSlice controller fills them); the endpoints\n")
	p("are addresses routed to a black hole, except those of the measured service, which are two\n")
	p("real servers in two pods of the node. At sizes of more than 100 endpoints per service the\n")
	p("measured service has as many endpoints as the others, every one a real server: addresses\n")
	p("of 10.245.0.0/16 that the two server pods take as local, half each.\n")
	p("The eBPF backend runs three ways: with its nftables table for traffic from outside\n")
	p("the node, socket programs only, and socket programs only with Maglev selection\n")
	p("(`Config.Scheduler`; every service has its own endpoints, so its own Maglev table).\n\n")
	p("- **first full sync**: for a proxykit backend, a child process (this tool re-executed)\n")
	p("  creates the backend's proxier for the node's namespace, delivers every Service and\n")
	p("  EndpointSlice to its handlers, then starts `Run` and times until `Flush` returns: the\n")
	p("  first sync has programmed the kernel. For a kube-proxy reference, the run of `nft -f`\n")
	p("  or `iptables-restore --noflush` on kube-proxy's rule set for the same services\n")
	p("  ([`internal/scale`](internal/scale/kubeproxy.go)); generating the rule set,\n")
	p("  and everything else kube-proxy would do, is not counted.\n")
	p("- **peak RSS**: the proxier child's VmHWM after the endpoint changes: Go runtime, the\n")
	p("  Services and EndpointSlices it was fed (kept, as an informer cache would), trackers and\n")
	p("  backend state; not the programs it runs (the iptables backend's `iptables-restore`).\n")
	p("  For a reference: the peak resident set (ru_maxrss) of the `nft` or `iptables-restore`\n")
	p("  process on the whole rule set, started by a small helper process (so a few MB of it are\n")
	p("  the helper's); kube-proxy itself is not run.\n")
	p("- **endpoint change**: one endpoint of one service's EndpointSlice replaced by another, a\n")
	p("  different service each time; from `OnEndpointSliceUpdate` to `Flush` returning, with\n")
	p("  `MinSyncInterval` 1 ms (kube-proxy's default 1 s rate limit would dominate) and no\n")
	p("  periodic resync. At most %d changes, stopped after %v (at least 5); n is how many were\n", rep.Options.Changes, rep.Options.ChangesTime)
	p("  made. For a reference: the loader's run on the transaction kube-proxy sends for that\n")
	p("  change (nftables: the new endpoint chain, the service chain rewritten, the old endpoint\n")
	p("  chain deleted; iptables: kube-proxy's partial restore, which rewrites KUBE-SERVICES with\n")
	p("  every service's rule, the service's chains and the endpoint chains).\n")
	p("- **connect**: a child process in the client pod's namespace opens %d TCP connections (after\n", rep.Options.Connects)
	p("  a warm-up) to the measured service's cluster IP, one at a time with blocking system\n")
	p("  calls on a locked thread; the figure is `connect()`, i.e. the handshake through the\n")
	p("  service translation both ways. For eBPF the child joins a cgroup of the run's own that\n")
	p("  the backend's socket programs are attached to. In the iptables reference the measured\n")
	p("  service's rule is in the middle of KUBE-SERVICES.\n\n")
	p("Reading the figures: the machine's other load (above) moves every figure, most of all\n")
	p("the p99s and the connect times, which are tens of microseconds; compare dataplanes\n")
	p("within one run. kube-proxy's iptables layout is one restore section with every chain,\n")
	p("and iptables-nft-restore (1.8.9 here) keeps a section's chains in a sorted list, so its\n")
	p("run grows with the square of the chains (the proxykit iptables backend writes sections of\n")
	p("about 3·√chains for that reason); iptables-legacy-restore does not. kube-proxy's nftables\n")
	p("layout, with a chain per endpoint, costs `nft` more than linear time as well.\n\n")
	p("Limits: sizes above `--max-services` (%d) are left out; a case whose first sync is\n", rep.Options.MaxServices)
	p("predicted (a power law through that dataplane's smaller sizes) to exceed `--case-limit`\n")
	p("(%v), or not to fit in what is left of `--time-limit` (%v), is cut, and larger sizes of\n", rep.Options.CaseLimit, rep.Options.TimeLimit)
	p("that dataplane with it.\n")
	return w.String()
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func seconds(s float64) string {
	switch {
	case s >= 10:
		return fmt.Sprintf("%.1f s", s)
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f ms", s*1000)
}

// num prints a figure with three significant digits at most.
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
