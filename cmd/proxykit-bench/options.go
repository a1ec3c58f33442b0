package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
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
		if !ok || err1 != nil || err2 != nil || n < 1 || e < 1 || e > 100 {
			return nil, fmt.Errorf("invalid size %q: want SERVICESxENDPOINTS, e.g. 1000x10 (at most 100 endpoints)", f)
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
	backendNames   = []string{"nftables", "iptables", "iptables-nft", "iptables-legacy", "ebpf", "ebpf-socket", "ebpf-maglev", "ipvs"}
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
	// Log receives progress lines.
	Log io.Writer
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
	}
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
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}
