package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/internal/nodesetup"
	"github.com/proxykit/proxykit/model"
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
// Otherwise it builds the mode's proxier, serves the healthz and metrics
// servers, feeds the proxier from informers on d.client and runs it until
// ctx is done. It leaves the dataplane in place when it returns, for the
// next instance to adopt: a restart does not disrupt traffic.
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

	if d.changes, err = nodesetup.Apply(ctx, s.nodeSetupConfig(cfg)); err != nil {
		return fmt.Errorf("could not set up the node from the kube-proxy configuration: %w", err)
	}
	if s.initOnly {
		log.Info("System initialized and --init-only specified", "changes", len(d.changes))
		return nil
	}

	p, err := backends.New(string(c.Mode), cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	nodes := &nodeTracker{Proxier: p, log: log, fatal: func(err error) {
		select {
		case errc <- err:
		default:
		}
	}}
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
	if c.HealthzBindAddress != "" {
		srv := &server{what: "healthz", addr: c.HealthzBindAddress, hardFail: c.BindAddressHardFail, log: log,
			handler: healthzHandler(p, nodes, families, cfg.HealthTimeout)}
		servers = append(servers, srv)
		if d.healthzAddr, err = srv.start(ctx); err != nil {
			return err
		}
	}
	if c.MetricsBindAddress != "" {
		srv := &server{what: "metrics", addr: c.MetricsBindAddress, hardFail: c.BindAddressHardFail, log: log,
			handler: metricsHandler(reg, string(c.Mode), configz, c.EnableProfiling, s.level)}
		servers = append(servers, srv)
		if d.metricsAddr, err = srv.start(ctx); err != nil {
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
	log.Info("proxy started", "mode", c.Mode, "node", d.nodeName)
	if d.ready != nil {
		close(d.ready)
	}
	pending := 2
	select {
	case <-ctx.Done():
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
