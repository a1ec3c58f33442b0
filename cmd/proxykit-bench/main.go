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
	var backends, refs, sizes, paths string
	var smoke, large bool
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
	flag.BoolVar(&large, "large", false, "large run (issue #22): "+formatSizes(largeOptions().Sizes)+" with --max-services=100000, --time-limit=1h, --case-limit=5m; report in a temporary directory unless --out/--plots are given")
	flag.BoolVar(&o.Verbose, "v", false, "pass the children's logs through")
	flag.StringVar(&o.ProfileDir, "profile", "", "write pprof profiles of every proxykit backend case into this directory: CPU of the first sync and of the endpoint changes, heap after them")
	flag.BoolVar(&o.Datapath, "datapath", false, "data-path mode: TCP_CRR and UDP packets/s from a client through node1's node port to an endpoint on node2, for --paths at --sizes (default "+formatSizes(datapathSizes)+")")
	flag.StringVar(&paths, "paths", strings.Join(o.Paths, ","), "data paths to measure with --datapath: "+strings.Join(dpPathNames(), ", "))
	flag.DurationVar(&o.DPRun, "run", o.DPRun, "with --datapath: timed window of each TCP_CRR and UDP run")
	flag.DurationVar(&o.DPWarmup, "warmup", o.DPWarmup, "with --datapath: untimed start of each run")
	flag.IntVar(&o.DPRepeat, "repeat", o.DPRepeat, "with --datapath: rounds over the paths (the report shows medians)")
	flag.IntVar(&o.DPClients, "clients", o.DPClients, "with --datapath: concurrent TCP_CRR clients")
	flag.IntVar(&o.DPServerThreads, "server-threads", o.DPServerThreads, "with --datapath: accepting threads of the TCP_CRR server")
	flag.IntVar(&o.DPFlows, "flows", o.DPFlows, "with --datapath: UDP source ports the sender cycles through (rounded up to a multiple of 64)")
	flag.IntVar(&o.DPSenderCPU, "sender-cpu", o.DPSenderCPU, "with --datapath: CPU the UDP sender is pinned to (negative: not pinned)")
	flag.BoolVar(&o.DPNAPI, "napi", o.DPNAPI, "with --datapath: node1 receives from the client with threaded NAPI (in a kernel thread, not in the sender's system calls)")
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
	if o.Datapath {
		if !set["sizes"] {
			sizes = formatSizes(datapathSizes)
		}
		if !set["time-limit"] {
			o.TimeLimit = datapathTimeLimit
		}
		if smoke {
			s := o
			datapathSmoke(&s)
			if !set["sizes"] {
				sizes = formatSizes(s.Sizes)
			}
			if !set["paths"] {
				paths = strings.Join(s.Paths, ",")
			}
			if !set["run"] {
				o.DPRun = s.DPRun
			}
			if !set["warmup"] {
				o.DPWarmup = s.DPWarmup
			}
			if !set["repeat"] {
				o.DPRepeat = s.DPRepeat
			}
			if !set["clients"] {
				o.DPClients = s.DPClients
			}
			if !set["time-limit"] {
				o.TimeLimit = s.TimeLimit
			}
		}
	}
	if large && o.Datapath {
		fatal(fmt.Errorf("--large is a size of the scale run, not of --datapath"))
	}
	if large {
		l := largeOptions()
		if !set["sizes"] {
			sizes = formatSizes(l.Sizes)
		}
		if !set["max-services"] {
			o.MaxServices = l.MaxServices
		}
		if !set["time-limit"] {
			o.TimeLimit = l.TimeLimit
		}
		if !set["case-limit"] {
			o.CaseLimit = l.CaseLimit
		}
	}
	if smoke {
		s := smokeOptions()
		if !set["sizes"] && !o.Datapath {
			sizes = formatSizes(s.Sizes)
		}
		if !set["changes"] {
			o.Changes = s.Changes
		}
		if !set["connects"] {
			o.Connects = s.Connects
		}
	}
	if smoke || large {
		// Not the default run's report: BENCHMARKS.md keeps that one.
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
	o.Backends, o.References, o.Paths = splitList(backends), splitList(refs), splitList(paths)
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
	if o.Datapath {
		rep, err := runDatapath(ctx, o)
		stop()
		if err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "bench: data path: %d cases in %v", len(rep.Cases), time.Since(start).Round(time.Second))
		if o.Out != "" {
			fmt.Fprintf(os.Stderr, "; report %s", o.Out)
		}
		fmt.Fprintln(os.Stderr)
		return
	}
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
