package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// The tool is a Go module of its own, so that the SDK's go.mod does not
// require its plotting library; `go run` from the repository's root cannot
// reach a nested module, so it is built first and then run from the root,
// where its default outputs (BENCHMARKS.md, docs/bench) are. Building as
// the user and running the binary with sudo also spares sudo a PATH with go.
const (
	buildCommand = "go build -C cmd/proxykit-bench -o /tmp/proxykit-bench ."
	runCommand   = "sudo /tmp/proxykit-bench"
)

func main() {
	if childMain() {
		return
	}
	o := defaultOptions()
	var backends, refs, sizes string
	var smoke bool
	flag.StringVar(&backends, "backends", strings.Join(o.Backends, ","), "proxykit backends to measure: "+strings.Join(backendNames, ", ")+" (iptables is the host's flavour)")
	flag.StringVar(&refs, "references", strings.Join(o.References, ","), "kube-proxy references to measure: "+strings.Join(referenceNames, ", "))
	flag.StringVar(&sizes, "sizes", formatSizes(o.Sizes), "service counts x endpoints per service")
	flag.IntVar(&o.MaxServices, "max-services", o.MaxServices, "leave out sizes with more services than this")
	flag.DurationVar(&o.TimeLimit, "time-limit", o.TimeLimit, "time budget of the whole run: cases predicted not to fit are cut, a running case is stopped at the limit")
	flag.DurationVar(&o.CaseLimit, "case-limit", o.CaseLimit, "cut a case whose first sync is predicted (from the smaller sizes) to take longer than this")
	flag.IntVar(&o.Changes, "changes", o.Changes, "endpoint changes per case")
	flag.DurationVar(&o.ChangesTime, "changes-time", o.ChangesTime, "stop the endpoint changes of a case after this long (at least 5 are made)")
	flag.IntVar(&o.Connects, "connects", o.Connects, "TCP connections per case")
	flag.StringVar(&o.Out, "out", o.Out, "Markdown report to write (empty: none)")
	flag.StringVar(&o.PlotDir, "plots", o.PlotDir, "directory of the SVG plots and results.json (empty: none)")
	flag.StringVar(&o.Note, "note", "", "a remark on the machine's conditions for the report, e.g. other load")
	flag.BoolVar(&smoke, "smoke", false, "smoke run: 100x10 only, few changes and connections, report in a temporary directory unless --out/--plots are given")
	flag.BoolVar(&o.Verbose, "v", false, "pass the children's logs through")
	from := flag.String("from", "", "measure nothing: write the report and the plots again from this results.json")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage, from the repository's root:\n\n\t%s && %s [flags]\n\n", buildCommand, runCommand)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if smoke {
		s := smokeOptions()
		if !set["sizes"] {
			sizes = formatSizes(s.Sizes)
		}
		if !set["changes"] {
			o.Changes = s.Changes
		}
		if !set["connects"] {
			o.Connects = s.Connects
		}
		if !set["out"] || !set["plots"] {
			dir, err := os.MkdirTemp("", "proxykit-bench-")
			if err != nil {
				fatal(err)
			}
			if !set["out"] {
				o.Out = dir + "/BENCHMARKS.md"
			}
			if !set["plots"] {
				o.PlotDir = dir
			}
		}
	}
	var err error
	if o.Sizes, err = parseSizes(sizes); err != nil {
		fatal(err)
	}
	o.Backends, o.References = splitList(backends), splitList(refs)
	o.Command = buildCommand + " && " + runCommand
	for _, a := range os.Args[1:] {
		o.Command += " " + shellQuote(a)
	}
	o.Log = os.Stderr
	if err := o.validate(); err != nil {
		fatal(err)
	}
	if *from != "" {
		if err := rewrite(*from, o); err != nil {
			fatal(err)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	start := time.Now()
	rep, err := run(ctx, o)
	stop()
	if err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "bench: %d cases in %v", len(rep.Cases), time.Since(start).Round(time.Second))
	if o.Out != "" {
		fmt.Fprintf(os.Stderr, "; report %s", o.Out)
	}
	fmt.Fprintln(os.Stderr)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./,:+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
