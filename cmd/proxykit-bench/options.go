package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/scale"
)

// Size is one scale: Services services of Endpoints endpoints each.
type Size struct {
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
}

func (s Size) String() string { return fmt.Sprintf("%dx%d", s.Services, s.Endpoints) }

// cost orders sizes by what they cost: the number of chains of
// kube-proxy's layouts, roughly services plus endpoints.
func (s Size) cost() float64 { return float64(s.Services) * float64(s.Endpoints+1) }

func parseSizes(s string) ([]Size, error) {
	var out []Size
	for _, f := range splitList(s) {
		a, b, ok := strings.Cut(f, "x")
		n, err1 := strconv.Atoi(a)
		e, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || e < 1 {
			return nil, fmt.Errorf("invalid size %q: want SERVICESxENDPOINTS, e.g. 1000x10", f)
		}
		// The generator's address ranges; the measured service gets as
		// many endpoints as the others (targetEndpoints).
		if n > scale.MaxServices || n*e > scale.MaxEndpoints || e > maxTargetEndpoints {
			return nil, fmt.Errorf("invalid size %q: at most %d services, %d endpoints per service and %d in all",
				f, scale.MaxServices, maxTargetEndpoints, scale.MaxEndpoints)
		}
		out = append(out, Size{n, e})
	}
	return out, nil
}

func formatSizes(s []Size) string {
	var f []string
	for _, x := range s {
		f = append(f, x.String())
	}
	return strings.Join(f, ",")
}

// Backend and reference names.
var (
	backendNames   = []string{"nftables", "iptables", "iptables-nft", "iptables-legacy", "ebpf", "ebpf-tc", "ebpf-xdp", "ebpf-socket", "ebpf-maglev", "ipvs"}
	referenceNames = []string{refNFT, refIPTables, refIPTablesNFT, refIPTablesLegacy}
)

// The kube-proxy references.
const (
	refNFT            = "kube-proxy-nftables"
	refIPTables       = "kube-proxy-iptables"        // the host's iptables-restore
	refIPTablesNFT    = "kube-proxy-iptables-nft"    // iptables-nft-restore
	refIPTablesLegacy = "kube-proxy-iptables-legacy" // iptables-legacy-restore
)

// Options configure a run.
type Options struct {
	Backends    []string
	References  []string
	Sizes       []Size
	MaxServices int
	TimeLimit   time.Duration
	CaseLimit   time.Duration
	Changes     int
	ChangesTime time.Duration
	Connects    int
	// Out is the Markdown report; PlotDir gets the SVGs and
	// results.json. Empty: not written.
	Out, PlotDir string
	// Note is a remark on the machine's conditions for the report.
	Note string
	// Command is the command line shown in the report.
	Command string
	Verbose bool
	// ProfileDir, when set, receives pprof profiles of the proxier
	// children (see proxierParams.Profile).
	ProfileDir string
	// Log receives progress lines.
	Log io.Writer

	// Datapath runs the data-path mode (datapath.go) instead: Paths at
	// Sizes, each round a TCP_CRR run and a UDP run of DPRun after
	// DPWarmup, DPRepeat rounds.
	Datapath        bool
	Paths           []string
	DPRun, DPWarmup time.Duration
	DPRepeat        int
	// DPClients are the concurrent TCP_CRR clients, DPServerThreads
	// the server's accepting threads.
	DPClients, DPServerThreads int
	// DPFlows is how many source ports the UDP sender cycles through.
	DPFlows int
	// DPSenderCPU pins the UDP sender (negative: not pinned).
	DPSenderCPU int
	// DPNAPI makes node1 receive from the client with threaded NAPI:
	// in a kernel thread of its own rather than in the sender's system
	// calls.
	DPNAPI bool
}

// defaultOptions is the default run, sized so that a 2-core machine
// finishes it in under 15 minutes.
func defaultOptions() Options {
	return Options{
		Backends:    []string{"nftables", "iptables-nft", "iptables-legacy", "ebpf", "ebpf-socket", "ebpf-maglev", "ipvs"},
		References:  []string{refNFT, refIPTablesNFT, refIPTablesLegacy},
		Sizes:       []Size{{100, 10}, {1000, 10}, {10000, 10}, {30000, 10}, {5000, 50}},
		MaxServices: 30000,
		TimeLimit:   14 * time.Minute,
		CaseLimit:   100 * time.Second,
		Changes:     100,
		ChangesTime: 15 * time.Second,
		Connects:    1000,
		Out:         "BENCHMARKS.md",
		PlotDir:     "docs/bench",

		Paths:           dpPathNames(),
		DPRun:           5 * time.Second,
		DPWarmup:        time.Second,
		DPRepeat:        3,
		DPClients:       8,
		DPServerThreads: 4,
		DPFlows:         256,
		DPSenderCPU:     0,
		DPNAPI:          true,
	}
}

// datapathSizes are the data-path mode's default sizes. One endpoint per
// generated service: a packet of the measured service does not depend on
// the other services' endpoints, and it keeps kube-proxy's layouts
// loadable at 10,000 services (its nftables layout took minutes at
// 10,000 × 10 in the scale run).
var datapathSizes = []Size{{10, 1}, {10000, 1}}

// datapathTimeLimit is the data-path mode's default time budget.
const datapathTimeLimit = 45 * time.Minute

// datapathSmoke sets the data-path smoke run's scale: 10 services,
// direct and nftables, one short round.
func datapathSmoke(o *Options) {
	o.Sizes = []Size{{10, 1}}
	o.Paths = []string{"direct", "nftables"}
	o.DPRun, o.DPWarmup, o.DPRepeat = 300*time.Millisecond, 100*time.Millisecond, 1
	o.DPClients = 4
	o.TimeLimit = 2 * time.Minute
}

// largeOptions is the --large run's scale (issue #22): big services,
// 1,000 × 1,000 and 10 × 10,000 endpoints, and 100,000 services × 10,
// with a time budget of an hour on 2 cores; the slowest dataplanes are
// cut at their larger sizes.
func largeOptions() Options {
	o := defaultOptions()
	o.Sizes = []Size{{10, 10000}, {1000, 1000}, {100000, 10}}
	o.MaxServices = 100000
	o.TimeLimit = time.Hour
	o.CaseLimit = 5 * time.Minute
	return o
}

// smokeOptions is the smoke run's scale.
func smokeOptions() Options {
	o := defaultOptions()
	o.Sizes = []Size{{100, 10}}
	o.Changes = 10
	o.Connects = 50
	o.TimeLimit = 5 * time.Minute
	return o
}

func (o *Options) validate() error {
	for _, b := range o.Backends {
		if !slices.Contains(backendNames, b) {
			return fmt.Errorf("unknown backend %q (have: %s)", b, strings.Join(backendNames, ", "))
		}
	}
	for _, r := range o.References {
		if !slices.Contains(referenceNames, r) {
			return fmt.Errorf("unknown reference %q (have: %s)", r, strings.Join(referenceNames, ", "))
		}
	}
	if len(o.Sizes) == 0 {
		return fmt.Errorf("no sizes")
	}
	if o.Changes < 1 || o.Connects < 1 {
		return fmt.Errorf("--changes and --connects must be positive")
	}
	if o.TimeLimit <= 0 || o.CaseLimit <= 0 {
		return fmt.Errorf("--time-limit and --case-limit must be positive")
	}
	if o.Datapath {
		for _, p := range o.Paths {
			if _, ok := dpPathByName(p); !ok {
				return fmt.Errorf("unknown data path %q (have: %s)", p, strings.Join(dpPathNames(), ", "))
			}
		}
		if len(o.Paths) == 0 {
			return fmt.Errorf("no data paths")
		}
		if o.DPRun <= 0 || o.DPWarmup < 0 || o.DPRepeat < 1 || o.DPClients < 1 || o.DPServerThreads < 1 || o.DPFlows < 1 {
			return fmt.Errorf("--run, --repeat, --clients, --server-threads and --flows must be positive")
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}
