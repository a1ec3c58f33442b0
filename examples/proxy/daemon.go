package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/internal/nodesetup"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/informer"
)

// shutdownTimeout bounds the wait for the proxier and the HTTP servers to
// stop.
const shutdownTimeout = 10 * time.Second

// daemon is one run of the proxy.
type daemon struct {
	s        *settings
	client   kubernetes.Interface
	nodeName string
	// stdout receives the report of --dry-run.
	stdout io.Writer

	// ready, when not nil, is closed once the servers listen and the
	// proxier runs; metricsAddr and healthzAddr are then set (nil while
	// a server waits for its address).
	ready                    chan struct{}
	metricsAddr, healthzAddr net.Addr
	// changes are the node settings the run changed.
	changes []nodesetup.Change
}

// run starts the proxy as kube-proxy's newProxyServer and Run do: it
// reads the Node when the configuration needs it (nodePortAddresses
// "primary", detectLocalMode NodeCIDR), makes the node settings
// (conntrack, the mode's sysctls) and, with --init-only, stops there.
// Otherwise it starts the event recorder, builds the mode's proxier,
// serves the healthz and metrics servers, feeds the proxier from
// informers on d.client, sends kube-proxy's Starting event and runs the
// proxier until ctx is done. With --bind-address-hard-fail a server that
// fails ends the run with kube-proxy's Warning event. It leaves the
// dataplane in place when it returns, for the next instance to adopt: a
// restart does not disrupt traffic.
func (d *daemon) run(ctx context.Context) (err error) {
	s := d.s
	c := &s.cfg
	log := s.log
	var info nodeInfo
	if c.needsNode() {
		if info, err = waitNode(ctx, d.client, d.nodeName, c.DetectLocalMode == localNodeCIDR, log); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), s.gates.collector())
	cfg, err := s.backendConfig(info, reg)
	if err != nil {
		return err
	}
	cfg.NodeName = d.nodeName
	if s.ext.dryRun {
		return d.dryRun(ctx, cfg)
	}

	if d.changes, err = nodesetup.Apply(ctx, s.nodeSetupConfig(cfg)); err != nil {
		return fmt.Errorf("could not set up the node from the kube-proxy configuration: %w", err)
	}
	if s.initOnly {
		log.Info("System initialized and --init-only specified", "changes", len(d.changes))
		return nil
	}

	// kube-proxy creates its broadcaster before the proxier and starts
	// writing in Run; what it records in between (IPVSDeprecation) the
	// broadcaster drops, having no sink yet. Ours writes from the start,
	// and is stopped last, once its events are written.
	recorder := newEventRecorder(d.client, d.nodeName, log)
	if err := recorder.start(); err != nil {
		return err
	}
	defer recorder.stop()
	cfg.ServiceHealthError = recorder.serviceHealthFailed

	p, err := backends.New(string(c.Mode), cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	if c.Mode == modeIPVS {
		recorder.ipvsDeprecation()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// errc gets the result of the proxier's and the informers'
	// goroutines; fatalc the first error that ends the run otherwise.
	errc := make(chan error, 2)
	fatalc := make(chan error, 1)
	fatal := func(err error) {
		select {
		case fatalc <- err:
		default:
		}
	}
	nodes := &nodeTracker{Proxier: p, log: log, fatal: fatal}
	if c.DetectLocalMode == localNodeCIDR {
		nodes.podCIDRs = info.podCIDRs
	}
	families := cfg.Families
	if len(families) == 0 {
		families = []model.IPFamily{model.IPv4, model.IPv6}
	}
	configz, err := configzJSON(c)
	if err != nil {
		return err
	}
	var servers []*server
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer scancel()
		for _, srv := range servers {
			err = errors.Join(err, srv.shutdown(sctx))
		}
	}()
	// A server that fails with hard-fail sends kube-proxy's event and
	// ends the run: at start (its address cannot be bound), or later.
	serverFailed := func(e *serverError) {
		recorder.serverFailed(e)
		fatal(e)
	}
	startServer := func(srv *server) (net.Addr, error) {
		srv.hardFail, srv.log, srv.failed = c.BindAddressHardFail, log, serverFailed
		servers = append(servers, srv)
		addr, err := srv.start(ctx)
		if se := (*serverError)(nil); errors.As(err, &se) {
			recorder.serverFailed(se)
		}
		return addr, err
	}
	if c.HealthzBindAddress != "" {
		srv := &server{what: serverHealthz, addr: c.HealthzBindAddress, handler: healthzHandler(p, nodes, families, cfg.HealthTimeout)}
		if d.healthzAddr, err = startServer(srv); err != nil {
			return err
		}
	}
	if c.MetricsBindAddress != "" {
		srv := &server{what: serverMetrics, addr: c.MetricsBindAddress, handler: metricsHandler(reg, string(c.Mode), configz, c.EnableProfiling, s.level, reporter(p))}
		if d.metricsAddr, err = startServer(srv); err != nil {
			return err
		}
	}

	go func() {
		if err := p.Run(ctx); err != nil {
			errc <- fmt.Errorf("proxier: %w", err)
			return
		}
		errc <- nil
	}()
	go func() {
		if err := informer.Run(ctx, d.client, nodes, informer.Config{NodeName: d.nodeName, Resync: c.ConfigSyncPeriod.Duration}); err != nil {
			errc <- fmt.Errorf("informers: %w", err)
			return
		}
		errc <- nil
	}()
	if !s.ext.keepLeftovers {
		// As kube-proxy removes its other modes' rules: once this
		// backend has synced, so that service never stops, what other
		// backends left in the namespace goes. A live proxier's is
		// refused and kept.
		go func() {
			if p.Flush(ctx) != nil {
				return
			}
			if err := backends.RemoveLeftovers(ctx, cfg, string(c.Mode)); err != nil {
				log.Warn("leftovers of other backends not all removed", "err", err)
			} else {
				log.Info("removed what other backends left in the namespace, if anything")
			}
		}()
	}
	// kube-proxy's birth cry: the informers run, the proxier syncs.
	recorder.starting()
	log.Info("proxy started", "mode", c.Mode, "node", d.nodeName)
	if d.ready != nil {
		close(d.ready)
	}
	pending := 2
	select {
	case <-ctx.Done():
	case err = <-fatalc:
	case err = <-errc:
		pending--
	}
	cancel()
	for ; pending > 0; pending-- {
		select {
		case e := <-errc:
			err = errors.Join(err, e)
		case <-time.After(shutdownTimeout):
			return errors.Join(err, errors.New("the proxier did not stop"))
		}
	}
	log.Info("proxy stopped; the dataplane stays in place")
	return err
}

// reporter returns /debug/services for p, or nil when p cannot report.
func reporter(p proxier.Proxier) http.Handler {
	if rep, ok := p.(proxier.Reporter); ok {
		return debugServicesHandler(rep)
	}
	return nil
}

// nodeSetupConfig is what nodesetup applies for the configuration: the
// conntrack section and the mode's settings, in the proxier's namespace,
// with "primary" already expanded in cfg.
func (s *settings) nodeSetupConfig(cfg backends.Config) nodesetup.Config {
	c := &s.cfg
	ns := nodesetup.Config{
		NetNS: s.ext.netns,
		Conntrack: nodesetup.Conntrack{
			MaxPerCore:       *c.Conntrack.MaxPerCore,
			Min:              *c.Conntrack.Min,
			TCPBeLiberal:     c.Conntrack.TCPBeLiberal,
			UDPTimeout:       c.Conntrack.UDPTimeout.Duration,
			UDPStreamTimeout: c.Conntrack.UDPStreamTimeout.Duration,
		},
		Mode:               string(c.Mode),
		IPVSStrictARP:      c.IPVS.StrictARP,
		LocalhostNodePorts: *c.IPTables.LocalhostNodePorts,
		Logger:             s.log,
	}
	if d := c.Conntrack.TCPEstablishedTimeout; d != nil {
		ns.Conntrack.TCPEstablishedTimeout = d.Duration
	}
	if d := c.Conntrack.TCPCloseWaitTimeout; d != nil {
		ns.Conntrack.TCPCloseWaitTimeout = d.Duration
	}
	for _, p := range cfg.NodePortAddresses {
		ns.NodePortAddresses = append(ns.NodePortAddresses, p.String())
	}
	return ns
}
