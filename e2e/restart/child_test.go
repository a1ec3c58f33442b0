package restart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/static"
)

// envChild, when set, makes the test binary a proxier process: its value
// is the JSON of a childParams.
const envChild = "PROXYKIT_RESTART_CHILD"

// childParams is what a proxier process runs.
type childParams struct {
	Backend string
	// NetNS is node1's namespace, the one the proxier programs.
	NetNS string
	// Source is the YAML file of Services and EndpointSlices.
	Source string
	// SourceCache is the static source's CacheDir: the first process
	// parses the file and leaves its decoded documents there, the
	// second reads them.
	SourceCache string
	// Services and Endpoints size the eBPF maps.
	Services, Endpoints int
	// Cgroup, PinPath and PodNetNS are the eBPF backend's.
	Cgroup, PinPath string
	PodNetNS        []string
	// IPTablesMode is the iptables backend's flavour (EnvIPTablesMode;
	// empty: detected).
	IPTablesMode string `json:",omitempty"`
	// CPUProfile, when set, is a file the process writes a CPU profile
	// of its start to (New, the source, the first sync) into.
	CPUProfile string `json:",omitempty"`
}

// childReport is the line a proxier process writes once synced.
type childReport struct {
	// Unsupported is set when the kernel lacks what the backend needs.
	Unsupported string `json:",omitempty"`
	// NewMS, FeedMS and SyncMS are the durations of backends.New, of
	// reading and delivering the source, and of the first sync (Run
	// started until Flush returned), in milliseconds.
	NewMS, FeedMS, SyncMS float64 `json:",omitempty"`
}

// config is the backends.Config of the proxier: the defaults of a
// daemon, node1's namespace and pod network, IPv4.
func (p childParams) config(log *slog.Logger) backends.Config {
	c := backends.Config{Config: proxier.Config{
		NetNS:        p.NetNS,
		NodeName:     testnet.Node1Name,
		Families:     []model.IPFamily{model.IPv4},
		ClusterCIDRs: []netip.Prefix{testnet.PodNetwork(model.IPv4)},
		Logger:       log,
	}}
	c.IPTables.Mode = iptables.Mode(p.IPTablesMode)
	if p.Backend == "ebpf" {
		c.EBPF = ebpf.Config{
			CgroupPath:  p.Cgroup,
			PinPath:     p.PinPath,
			PodNetNS:    p.PodNetNS,
			MaxServices: max(ebpf.DefaultMaxServices, roundPow2(2*p.Services+64)),
			MaxBackends: max(ebpf.DefaultMaxBackends, roundPow2(p.Services*p.Endpoints+1024)),
		}
	}
	return c
}

func roundPow2(n int) int { return 1 << bits.Len(uint(n-1)) }

// TestMain runs the proxier process when envChild says so, else the
// tests.
func TestMain(m *testing.M) {
	if p := os.Getenv(envChild); p != "" {
		if err := childMain(p); err != nil {
			fmt.Fprintln(os.Stderr, "restart child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childMain is the proxier process: it builds the backend, delivers the
// source's objects, runs the sync loop, writes a childReport when the
// first sync has programmed them, and runs until SIGTERM (or SIGKILL).
// Its logs go to standard error.
func childMain(params string) error {
	var p childParams
	if err := json.Unmarshal([]byte(params), &p); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	out := json.NewEncoder(os.Stdout)

	if p.CPUProfile != "" {
		f, err := os.Create(p.CPUProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer stopProfile(f) // on an error; else once synced
	}
	start := time.Now()
	pr, err := backends.New(p.Backend, p.config(log))
	if errors.Is(err, proxier.ErrNotSupported) {
		return out.Encode(childReport{Unsupported: err.Error()})
	}
	if err != nil {
		return err
	}
	defer pr.Close()
	var rep childReport
	rep.NewMS = ms(time.Since(start))

	start = time.Now()
	src := &static.Source{Path: p.Source, CacheDir: p.SourceCache, Logger: log}
	if err := src.Run(ctx, pr); err != nil { // no Watch: returns once delivered
		return err
	}
	rep.FeedMS = ms(time.Since(start))

	start = time.Now()
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()
	if err := pr.Flush(ctx); err != nil {
		return fmt.Errorf("first sync: %w", err)
	}
	rep.SyncMS = ms(time.Since(start))
	if p.CPUProfile != "" {
		pprof.StopCPUProfile()
	}
	if err := out.Encode(rep); err != nil {
		return err
	}
	return <-done
}

// stopProfile ends the CPU profile (if still running) and closes its
// file.
func stopProfile(f *os.File) {
	pprof.StopCPUProfile()
	f.Close()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
