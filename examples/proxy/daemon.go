package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/informer"
)

// options are the daemon's command line.
type options struct {
	kubeconfig        string
	backend           string
	nodeName          string
	clusterCIDRs      []netip.Prefix
	nodePortAddresses []netip.Prefix
	masqueradeAll     bool
	minSyncPeriod     time.Duration
	syncPeriod        time.Duration
	metricsAddr       string
	healthzAddr       string
	netns             string
	keepLeftovers     bool
	logger            *slog.Logger

	// Backend options.
	masqueradeMark uint32            // 1 << kube-proxy's --iptables-masquerade-bit; 0: the default
	scheduler      proxier.Scheduler // ipvs and ebpf
	ipvsStrictARP  bool
	ebpfCgroup     string
	ebpfAllNetNS   bool
	ebpfPinPath    string
	ebpfSocketOnly bool
}

// check reports options that cannot work together.
func (o options) check() error {
	if o.backend == "nftables" || o.backend == "iptables" {
		if s, _ := o.scheduler.Canonical(); s != "" && s != proxier.SchedulerRandom {
			return fmt.Errorf("--scheduler %s: the %s backend picks endpoints at random; schedulers are for ipvs and ebpf", o.scheduler, o.backend)
		}
	}
	return nil
}

// config is the registry configuration the options describe: the
// proxier's, and each backend's section.
func (o options) config(reg prometheus.Registerer) backends.Config {
	cfg := backends.Config{Config: o.proxierConfig(reg)}
	cfg.NFTables.MasqueradeBit = o.masqueradeMark
	cfg.IPTables.MasqueradeBit = o.masqueradeMark
	cfg.IPVS.MasqueradeBit = o.masqueradeMark
	cfg.IPVS.Scheduler = o.scheduler
	cfg.IPVS.StrictARP = o.ipvsStrictARP
	cfg.EBPF.Scheduler = o.scheduler
	cfg.EBPF.CgroupPath = o.ebpfCgroup
	cfg.EBPF.AllNetNS = o.ebpfAllNetNS
	cfg.EBPF.PinPath = o.ebpfPinPath
	cfg.EBPF.SocketOnly = o.ebpfSocketOnly
	return cfg
}

// proxierConfig is the proxier configuration the options describe.
func (o options) proxierConfig(reg prometheus.Registerer) proxier.Config {
	return proxier.Config{
		NetNS:             o.netns,
		NodeName:          o.nodeName,
		ClusterCIDRs:      o.clusterCIDRs,
		NodePortAddresses: o.nodePortAddresses,
		MasqueradeAll:     o.masqueradeAll,
		MinSyncInterval:   o.minSyncPeriod,
		SyncPeriod:        o.syncPeriod,
		Logger:            o.logger,
		Registerer:        reg,
	}
}

// shutdownTimeout bounds the wait for the proxier and the HTTP servers to
// stop.
const shutdownTimeout = 10 * time.Second

// daemon is one run of the proxy.
type daemon struct {
	opts   options
	client kubernetes.Interface

	// ready, when not nil, is closed once the servers listen and the
	// proxier runs; metricsAddr and healthzAddr are then set (nil when
	// disabled).
	ready                    chan struct{}
	metricsAddr, healthzAddr net.Addr
}

// run builds the proxier, serves metrics and health, feeds the proxier
// from informers on d.client and runs it until ctx is done. It leaves the
// dataplane in place when it returns, for the next instance to adopt:
// a restart does not disrupt traffic.
func (d *daemon) run(ctx context.Context) (err error) {
	o := d.opts
	log := o.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
		o.logger = log
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := o.check(); err != nil {
		return err
	}
	cfg := o.config(reg)
	p, err := backends.New(o.backend, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()

	var servers []*http.Server
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		for _, s := range servers {
			err = errors.Join(err, s.Shutdown(sctx))
		}
	}()
	serve := func(what, addr string, h http.Handler) (net.Addr, error) {
		if addr == "" {
			return nil, nil
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		go func() {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server failed", "server", what, "err", err)
			}
		}()
		log.Info("serving", "server", what, "address", l.Addr().String())
		return l.Addr(), nil
	}
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if d.metricsAddr, err = serve("metrics", o.metricsAddr, metrics); err != nil {
		return err
	}
	if d.healthzAddr, err = serve("healthz", o.healthzAddr, healthHandler(p, cfg.HealthTimeout)); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() {
		if err := p.Run(ctx); err != nil {
			errc <- fmt.Errorf("proxier: %w", err)
			return
		}
		errc <- nil
	}()
	go func() {
		if err := informer.Run(ctx, d.client, p, informer.Config{NodeName: o.nodeName}); err != nil {
			errc <- fmt.Errorf("informers: %w", err)
			return
		}
		errc <- nil
	}()
	if !o.keepLeftovers {
		// As kube-proxy removes its other modes' rules: once this
		// backend has synced, so that service never stops, what other
		// backends left in the namespace goes. A live proxier's is
		// refused and kept.
		go func() {
			if p.Flush(ctx) != nil {
				return
			}
			if err := backends.RemoveLeftovers(ctx, cfg, o.backend); err != nil {
				log.Warn("leftovers of other backends not all removed", "err", err)
			} else {
				log.Info("removed what other backends left in the namespace, if anything")
			}
		}()
	}
	log.Info("proxy started", "backend", o.backend, "node", o.nodeName)
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

// healthHandler serves /healthz and /livez: kube-proxy's, from the
// engine's health, when the proxier reports it.
func healthHandler(p proxier.Proxier, timeout time.Duration) http.Handler {
	if hr, ok := p.(proxier.HealthReporter); ok {
		return proxier.HealthHandler(hr, timeout)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux := http.NewServeMux()
	mux.Handle("/healthz", ok)
	mux.Handle("/livez", ok)
	return mux
}

// runCleanup removes what every backend programmed in the namespace the
// options name (--cleanup), under the names the options give (e.g. the
// eBPF backend's pin path).
func runCleanup(ctx context.Context, o options) error {
	return backends.CleanupAll(ctx, o.config(nil), "")
}

// schedulerFlag is a flag naming a [proxier.Scheduler].
type schedulerFlag struct{ s *proxier.Scheduler }

func (f schedulerFlag) String() string {
	if f.s == nil {
		return ""
	}
	return string(*f.s)
}

func (f schedulerFlag) Set(v string) error {
	s, ok := proxier.Scheduler(v).Canonical()
	if !ok {
		return fmt.Errorf("unknown scheduler %q", v)
	}
	*f.s = s
	return nil
}

// prefixList is a flag of comma-separated CIDRs.
type prefixList struct{ p *[]netip.Prefix }

func (l prefixList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, p := range *l.p {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (l prefixList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return err
		}
		*l.p = append(*l.p, p.Masked())
	}
	return nil
}
