package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestMain lets the test binary serve as the tool's child processes,
// which the tool starts by re-executing its own binary.
func TestMain(m *testing.M) {
	childMain()
	os.Exit(m.Run())
}

// TestSmoke runs the tool's code path at 100 services for the nftables
// and iptables backends and both kube-proxy references, in namespaces it
// creates, and checks that every figure was measured and every output
// written. It asserts no timing.
func TestSmoke(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "iptables-restore")
	o := smokeOptions()
	o.Backends = []string{"nftables", "iptables"}
	o.References = []string{refNFT, refIPTables}
	o.Changes, o.Connects = 10, 50
	o.TimeLimit = 2 * time.Minute
	dir := t.TempDir()
	o.Out, o.PlotDir = filepath.Join(dir, "BENCHMARKS.md"), dir
	o.Command = buildCommand + " && " + runCommand + " --smoke"
	o.Log = logWriter{t}
	rep, err := run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 4 {
		t.Fatalf("%d cases, want 4", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		if !c.ok() {
			t.Errorf("%s: %s: %s", c.Label, c.Status, c.Reason)
			continue
		}
		if c.SyncSeconds <= 0 || c.PeakRSSMB <= 0 {
			t.Errorf("%s: sync %v s, peak RSS %v MB", c.Label, c.SyncSeconds, c.PeakRSSMB)
		}
		if c.Change.N < 5 || c.Change.Median <= 0 {
			t.Errorf("%s: changes %+v", c.Label, c.Change)
		}
		if c.Connect.N != o.Connects || c.Connect.Median <= 0 || c.FirstByte.N != o.Connects {
			t.Errorf("%s: connects %+v", c.Label, c.Connect)
		}
	}
	md, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### 100 services × 10 endpoints", "| nftables |", "kube-proxy iptables", o.Command, "sync-time.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, f := range []string{plotSync, plotChange, plotConnect, resultsJSON} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Error(err)
			continue
		}
		if strings.HasSuffix(f, ".svg") && !strings.Contains(string(b[:min(len(b), 512)]), "<svg") {
			t.Errorf("%s is no SVG: %.200s", f, b)
		}
	}
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

func TestStats(t *testing.T) {
	var ns []int64
	for i := 100; i >= 1; i-- {
		ns = append(ns, int64(i)*1000)
	}
	s := stats(ns, 1e3)
	if s.N != 100 || s.Median != 50 || s.P99 != 99 || s.Min != 1 || s.Max != 100 {
		t.Errorf("stats = %+v", s)
	}
	if s := stats(nil, 1); s.N != 0 {
		t.Errorf("stats(nil) = %+v", s)
	}
}

func TestPredict(t *testing.T) {
	done := []*Case{
		{Size: Size{1000, 10}, SyncSeconds: 1},
		{Size: Size{10000, 10}, SyncSeconds: 100}, // quadratic
	}
	if p := predict(done, Size{30000, 10}); p < 899 || p > 901 {
		t.Errorf("quadratic: predicted %v, want 900", p)
	}
	done[1].SyncSeconds = 2 // sublinear: taken as linear
	if p := predict(done, Size{30000, 10}); p < 5.99 || p > 6.01 {
		t.Errorf("linear: predicted %v, want 6", p)
	}
	if p := predict(nil, Size{30000, 10}); p != 0 {
		t.Errorf("nothing measured: predicted %v", p)
	}
}

func TestParseSizes(t *testing.T) {
	s, err := parseSizes("100x10, 5000x50,1000x1000,10x10000,100000x10")
	if err != nil || len(s) != 5 || s[1] != (Size{5000, 50}) || s[3] != (Size{10, 10000}) {
		t.Fatalf("parseSizes = %v, %v", s, err)
	}
	// Past the generator's address ranges: services, endpoints in all,
	// endpoints of the measured service.
	for _, bad := range []string{"100", "x10", "100x0", "ax10", "300000x1", "2000x1000", "1x70000"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q) succeeded", bad)
		}
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"--sizes=100x10,1000x10": "--sizes=100x10,1000x10",
		"a note, with spaces":    "'a note, with spaces'",
		"it's":                   `'it'\''s'`,
		"":                       "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
