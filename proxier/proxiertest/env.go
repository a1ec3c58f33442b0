package proxiertest

import (
	"context"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Intervals the suite configures, short so that a case runs in seconds.
const (
	minSyncInterval = 50 * time.Millisecond
	syncPeriod      = 10 * time.Second
	retryInterval   = 100 * time.Millisecond

	flushTimeout   = 15 * time.Second
	stopTimeout    = 10 * time.Second
	cleanupTimeout = 30 * time.Second
)

// env is one case's world: a topology, the objects delivered so far, and
// the proxier instances started in it.
type env struct {
	t       *testing.T
	fam     model.IPFamily
	dual    bool
	factory Factory
	opts    Options
	tn      *testnet.Topology
	log     *slog.Logger
	// configure, when set, changes the configuration of the proxiers
	// the case builds after it is set (see env.config).
	configure func(*proxier.Config)

	svcs   map[string]*v1.Service
	slices map[string]*discoveryv1.EndpointSlice
	node   *v1.Node
	rv     int
	ipIdx  map[string]int

	cur *instance
	all []*instance
}

// instance is one proxier built by the factory.
type instance struct {
	p       proxier.Proxier
	cancel  context.CancelFunc
	done    chan error
	running bool
	cleaned bool
	closed  bool
}

func newEnv(t *testing.T, f Factory, opts Options, fam model.IPFamily, dual bool) *env {
	tn := testnet.New(t, testnet.Options{})
	e := &env{
		t: t, fam: fam, dual: dual, factory: f, opts: opts, tn: tn,
		svcs:   map[string]*v1.Service{},
		slices: map[string]*discoveryv1.EndpointSlice{},
		ipIdx:  map[string]int{},
	}
	// Cleanups run last-in first-out: the proxier stops, then logging
	// ends, then the topology goes.
	var logDone atomic.Bool
	t.Cleanup(func() { logDone.Store(true) })
	e.log = slog.New(slog.NewTextHandler(&testWriter{t: t, done: &logDone}, &slog.HandlerOptions{Level: opts.LogLevel}))
	t.Cleanup(e.teardown)
	e.node = e.nodeObject()
	registerPods(t, tn)
	return e
}

// testWriter writes each log record to the test log, and drops records
// once the test is over (a proxier that outlived it must not panic the
// test binary).
type testWriter struct {
	t    *testing.T
	done *atomic.Bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log("proxier: " + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// families are the IP families the case's proxier programs.
func (e *env) families() []model.IPFamily {
	if e.dual {
		return []model.IPFamily{model.IPv4, model.IPv6}
	}
	return []model.IPFamily{e.fam}
}

// config is the proxier configuration of the case.
func (e *env) config() proxier.Config {
	var cidrs []netip.Prefix
	for _, f := range e.families() {
		cidrs = append(cidrs, testnet.PodNetwork(f))
	}
	c := proxier.Config{
		NetNS:           e.tn.Node1.Path(),
		NodeName:        testnet.Node1Name,
		Families:        e.families(),
		ClusterCIDRs:    cidrs,
		MinSyncInterval: minSyncInterval,
		SyncPeriod:      syncPeriod,
		RetryInterval:   retryInterval,
		Logger:          e.log,
	}
	if e.configure != nil {
		e.configure(&c)
	}
	return c
}

// start builds a proxier with the factory, delivers every object known so
// far followed by the Synced calls, runs it and waits for Flush.
func (e *env) start() {
	e.t.Helper()
	e.startWithin(flushTimeout)
}

// startWithin is start, waiting up to timeout for the first Flush.
func (e *env) startWithin(timeout time.Duration) {
	e.t.Helper()
	if e.cur != nil && e.cur.running {
		e.t.Fatal("proxiertest: start with a proxier running")
	}
	in := e.build()
	p := in.p
	p.OnNodeAdd(e.node)
	p.OnNodeSynced()
	for _, k := range sortedKeys(e.svcs) {
		p.OnServiceAdd(e.svcs[k])
	}
	p.OnServiceSynced()
	for _, k := range sortedKeys(e.slices) {
		p.OnEndpointSliceAdd(e.slices[k])
	}
	p.OnEndpointSlicesSynced()
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel, in.done, in.running = cancel, make(chan error, 1), true
	go func() { in.done <- p.Run(ctx) }()
	e.flushWithin(timeout)
}

// build calls the factory and records the new instance as the current one.
func (e *env) build() *instance {
	e.t.Helper()
	p := e.factory(e.t, e.config())
	if p == nil {
		e.t.Fatal("proxiertest: the factory returned a nil Proxier")
	}
	in := &instance{p: p}
	e.all = append(e.all, in)
	e.cur = in
	return in
}

// flush waits until the running proxier has programmed every event
// delivered so far.
func (e *env) flush() {
	e.t.Helper()
	e.flushWithin(flushTimeout)
}

// flushWithin is flush, waiting up to timeout.
func (e *env) flushWithin(timeout time.Duration) {
	e.t.Helper()
	in := e.cur
	if in == nil || !in.running {
		e.t.Fatal("proxiertest: flush without a running proxier")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- in.p.Flush(ctx) }()
	select {
	case err := <-errc:
		if err != nil {
			e.t.Fatalf("Flush: %v", err)
		}
		e.checkInspected(in, timeout)
	case err := <-in.done:
		in.running = false
		e.t.Fatalf("Run returned before Flush did: %v", err)
	}
}

// stop cancels the current proxier's Run and waits for it to return.
func (e *env) stop() {
	e.t.Helper()
	e.stopInstance(e.cur)
}

func (e *env) stopInstance(in *instance) {
	e.t.Helper()
	if in == nil || !in.running {
		return
	}
	in.running = false
	in.cancel()
	select {
	case err := <-in.done:
		if err != nil {
			e.t.Errorf("Run: %v", err)
		}
	case <-time.After(stopTimeout):
		e.t.Errorf("Run did not return within %v of its context being cancelled", stopTimeout)
	}
}

// cleanup calls Cleanup on the current proxier, which must not be running.
func (e *env) cleanup() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	e.cur.cleaned = true
	if err := e.cur.p.Cleanup(ctx); err != nil {
		e.t.Errorf("Cleanup: %v", err)
	}
}

// close calls Close on the current proxier.
func (e *env) close() {
	e.t.Helper()
	e.cur.closed = true
	if err := e.cur.p.Close(); err != nil {
		e.t.Errorf("Close: %v", err)
	}
}

// teardown stops every proxier, cleans up after the last one and closes
// them all. On failure it first logs the node's dataplane.
func (e *env) teardown() {
	if e.t.Failed() {
		e.dump()
	}
	for _, in := range e.all {
		e.stopInstance(in)
	}
	if e.cur != nil && !e.cur.cleaned {
		e.cleanup()
	}
	for _, in := range e.all {
		if !in.closed {
			in.closed = true
			if err := in.p.Close(); err != nil {
				e.t.Errorf("Close: %v", err)
			}
		}
	}
}

// dump logs the node's rule sets and connection tracking table.
func (e *env) dump() {
	for _, cmd := range [][]string{
		{"nft", "list", "ruleset"},
		{"iptables-save"},
		{"ip6tables-save"},
		{"conntrack", "-L"},
	} {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := e.tn.Node1.Exec(ctx, cmd[0], cmd[1:]...)
		cancel()
		if len(out) > 20000 {
			out = out[:20000] + "\n[...]"
		}
		e.t.Logf("node1 $ %s (%v)\n%s", strings.Join(cmd, " "), err, out)
	}
}

// apply delivers objects (*v1.Service, *discoveryv1.EndpointSlice,
// []*discoveryv1.EndpointSlice, *v1.Node) as adds or updates, and waits
// for Flush when a proxier runs. It keeps copies, so callers may change
// and apply the same object again.
func (e *env) apply(objs ...any) {
	e.t.Helper()
	running := e.cur != nil && e.cur.running
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			n := o.DeepCopy()
			n.ResourceVersion = e.nextRV()
			old, ok := e.svcs[n.Name]
			e.svcs[n.Name] = n
			switch {
			case !running:
			case ok:
				e.cur.p.OnServiceUpdate(old, n)
			default:
				e.cur.p.OnServiceAdd(n)
			}
		case []*discoveryv1.EndpointSlice:
			for _, s := range o {
				e.applySlice(s, running)
			}
		case *discoveryv1.EndpointSlice:
			e.applySlice(o, running)
		case *v1.Node:
			n := o.DeepCopy()
			n.ResourceVersion = e.nextRV()
			old := e.node
			e.node = n
			if running {
				e.cur.p.OnNodeUpdate(old, n)
			}
		default:
			e.t.Fatalf("proxiertest: cannot apply %T", o)
		}
	}
	if running {
		e.flush()
	}
}

func (e *env) applySlice(s *discoveryv1.EndpointSlice, running bool) {
	n := s.DeepCopy()
	n.ResourceVersion = e.nextRV()
	old, ok := e.slices[n.Name]
	e.slices[n.Name] = n
	switch {
	case !running:
	case ok:
		e.cur.p.OnEndpointSliceUpdate(old, n)
	default:
		e.cur.p.OnEndpointSliceAdd(n)
	}
}

// remove delivers deletions of objects known by name, and waits for
// Flush when a proxier runs.
func (e *env) remove(objs ...any) {
	e.t.Helper()
	running := e.cur != nil && e.cur.running
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			old, ok := e.svcs[o.Name]
			if !ok {
				e.t.Fatalf("proxiertest: remove unknown service %s", o.Name)
			}
			delete(e.svcs, o.Name)
			if running {
				e.cur.p.OnServiceDelete(old)
			}
		case []*discoveryv1.EndpointSlice:
			for _, s := range o {
				e.removeSlice(s, running)
			}
		case *discoveryv1.EndpointSlice:
			e.removeSlice(o, running)
		default:
			e.t.Fatalf("proxiertest: cannot remove %T", o)
		}
	}
	if running {
		e.flush()
	}
}

func (e *env) removeSlice(s *discoveryv1.EndpointSlice, running bool) {
	old, ok := e.slices[s.Name]
	if !ok {
		e.t.Fatalf("proxiertest: remove unknown EndpointSlice %s", s.Name)
	}
	delete(e.slices, s.Name)
	if running {
		e.cur.p.OnEndpointSliceDelete(old)
	}
}

func (e *env) nextRV() string {
	e.rv++
	return strconv.Itoa(e.rv)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Shorthands for the hosts of the topology.

func (e *env) node1() *testnet.Host  { return &e.tn.Node1.Host }
func (e *env) client() *testnet.Host { return e.tn.Client }

// pod returns pod i (from 1) behind node n (1 or 2).
func (e *env) pod(n, i int) *testnet.Pod {
	node := e.tn.Node1
	if n == 2 {
		node = e.tn.Node2
	}
	return node.Pods[i-1]
}
