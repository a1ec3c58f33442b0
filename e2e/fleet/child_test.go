package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/informer"
)

// envChild, when set, makes the test binary a proxier process: its value
// is the JSON of a childParams.
const envChild = "PROXYKIT_FLEET_CHILD"

// childParams is what one node's proxier process runs.
type childParams struct {
	// Kubeconfig holds the ServiceAccount token of examples/proxy's
	// manifest.
	Kubeconfig string
	// NodeName is the proxier's node (and Node object).
	NodeName string
	// NetNS is the node namespace the proxier programs.
	NetNS string
	// MinSync is the proxier's MinSyncInterval.
	MinSync time.Duration
	// ConntrackCleanup keeps the engine's conntrack cleanup after each
	// sync (off: Config.NoConntrackCleanup).
	ConntrackCleanup bool `json:",omitempty"`
	// CPUProfile, when set, is where the process writes its CPU
	// profile, from its start until SIGTERM.
	CPUProfile string `json:",omitempty"`
}

// TestMain runs the proxier process when envChild says so, else the
// tests.
func TestMain(m *testing.M) {
	if p := os.Getenv(envChild); p != "" {
		if err := childMain(p); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childMain is one node's proxier, as examples/proxy runs it: the
// nftables backend programming the node namespace, fed by the informer
// source over a client with the daemon's defaults (protobuf, QPS 5,
// burst 10). It runs until SIGTERM. Each Service or EndpointSlice update
// it receives is written to standard output as "E <kind> <ns>/<name>
// <unix ns>" before the proxier's handler sees it, so the test can tell
// the API server's watch delivery from the proxier's sync. Logs go to
// standard error.
func childMain(params string) error {
	var p childParams
	if err := json.Unmarshal([]byte(params), &p); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	out := &eventLog{w: bufio.NewWriter(os.Stdout)}
	log := slog.New(&syncTap{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), out: out})
	if p.CPUProfile != "" {
		f, err := os.Create(p.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 5, 10
	cfg.UserAgent = "proxykit-fleet/" + p.NodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pr, err := nftables.New(nftables.Config{Config: proxier.Config{
		NetNS:           p.NetNS,
		NodeName:        p.NodeName,
		Families:        []model.IPFamily{model.IPv4},
		ClusterCIDRs:    []netip.Prefix{testnet.PodNetworkIPv4},
		MinSyncInterval: p.MinSync,
		// See EnvConntrackCleanup.
		NoConntrackCleanup: !p.ConntrackCleanup,
		Logger:             log,
	}})
	if err != nil {
		return err
	}
	defer pr.Close()
	rec := &recorder{Proxier: pr, out: out}

	errs := make(chan error, 2)
	go func() { errs <- pr.Run(ctx) }()
	go func() { errs <- informer.Run(ctx, client, rec, informer.Config{NodeName: p.NodeName}) }()
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// recorder is a Proxier that writes the time of every Service and
// EndpointSlice update to out before handing it on.
type recorder struct {
	proxier.Proxier
	out *eventLog
}

func (r *recorder) OnServiceUpdate(old, svc *v1.Service) {
	r.out.event("svc", svc.Namespace, svc.Name)
	r.Proxier.OnServiceUpdate(old, svc)
}

func (r *recorder) OnEndpointSliceUpdate(old, s *discoveryv1.EndpointSlice) {
	r.out.event("slice", s.Namespace, s.Name)
	r.Proxier.OnEndpointSliceUpdate(old, s)
}

// syncTap is a slog.Handler that hands the records its Handler enables
// on, and writes a line "S <end, unix ns> <duration ns> <full>" for each
// of the engine's "synced" records (level Debug), so that the test can
// tell the proxier's sync from the probes' view of it.
type syncTap struct {
	slog.Handler
	out  *eventLog
	full bool // the "full" attribute the engine adds with Logger.With
}

func (h *syncTap) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelDebug
}

func (h *syncTap) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "synced" {
		var d time.Duration
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "duration" {
				d = a.Value.Duration()
			}
			return true
		})
		h.out.line("S %d %d %t", r.Time.UnixNano(), d.Nanoseconds(), h.full)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *syncTap) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.Handler = h.Handler.WithAttrs(as)
	for _, a := range as {
		if a.Key == "full" {
			c.full = a.Value.Bool()
		}
	}
	return &c
}

func (h *syncTap) WithGroup(name string) slog.Handler {
	c := *h
	c.Handler = h.Handler.WithGroup(name)
	return &c
}

// eventLog writes event lines; safe for concurrent use.
type eventLog struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *eventLog) event(kind, ns, name string) {
	l.line("E %s %s/%s %d", kind, ns, name, time.Now().UnixNano())
}

func (l *eventLog) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
	l.w.Flush()
}
