package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
)

func main() {
	o := options{}
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the in-cluster configuration, else $KUBECONFIG or ~/.kube/config")
	flag.StringVar(&o.backend, "backend", "nftables", "dataplane backend: "+strings.Join(backends.Names(), ", "))
	flag.StringVar(&o.nodeName, "hostname-override", "", "this node's name (default: the host name)")
	flag.Var(prefixList{&o.clusterCIDRs}, "cluster-cidr", "pod networks, comma-separated; service traffic from outside them is masqueraded")
	flag.Var(prefixList{&o.nodePortAddresses}, "nodeport-addresses", "node addresses (CIDRs, comma-separated) node ports open on; default: all local addresses")
	flag.BoolVar(&o.masqueradeAll, "masquerade-all", false, "masquerade all service traffic")
	flag.DurationVar(&o.minSyncPeriod, "min-sync-period", proxier.DefaultMinSyncInterval, "least time between two syncs")
	flag.DurationVar(&o.syncPeriod, "sync-period", proxier.DefaultSyncPeriod, "interval of full resyncs")
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics; empty disables it")
	flag.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty disables them")
	flag.BoolVar(&o.keepLeftovers, "keep-leftovers", false, "do not remove, once synced, what other backends left in the namespace")
	flag.StringVar(&o.netns, "netns", "", "program this network namespace (a path like /var/run/netns/x) instead of the process's own")
	flag.Func("iptables-masquerade-bit", "the packet mark bit (0 to 31) that asks for masquerading: nftables, iptables, ipvs (default 14)", func(v string) error {
		bit, err := strconv.Atoi(v)
		if err != nil || bit < 0 || bit > 31 {
			return fmt.Errorf("want 0 to 31")
		}
		o.masqueradeMark = 1 << bit
		return nil
	})
	flag.Var(schedulerFlag{&o.scheduler}, "scheduler", "load-balancing algorithm of the ipvs (rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh; default rr) or ebpf backend (random or maglev; default random); nftables and iptables pick at random")
	flag.Var(schedulerFlag{&o.scheduler}, "ipvs-scheduler", "kube-proxy's name of --scheduler")
	flag.BoolVar(&o.ipvsStrictARP, "ipvs-strict-arp", false, "ipvs: set arp_ignore=1 and arp_announce=2, so the node does not answer ARP for the service addresses")
	flag.StringVar(&o.ebpfCgroup, "ebpf-cgroup", "/sys/fs/cgroup", "ebpf: the cgroup v2 directory whose processes' sockets are translated")
	flag.BoolVar(&o.ebpfAllNetNS, "ebpf-all-netns", true, "ebpf: translate the sockets of every network namespace under --ebpf-cgroup (the pods'), not only the node's")
	flag.StringVar(&o.ebpfPinPath, "ebpf-pin-path", "", "ebpf: a directory on a bpffs where maps and links are pinned, so that a restart adopts them and --cleanup finds them; empty: nothing pinned")
	flag.BoolVar(&o.ebpfSocketOnly, "ebpf-socket-only", false, "ebpf: only the socket programs, without the nftables table for traffic from outside the node")
	cleanup := flag.Bool("cleanup", false, "remove what every backend programmed on this node, and exit")
	verbose := flag.Bool("v", false, "log every sync")
	flag.Parse()

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	o.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *cleanup {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := runCleanup(cctx, o); err != nil {
			fail(err)
		}
		o.logger.Info("cleaned up", "backends", backends.Names())
		return
	}
	if err := o.check(); err != nil {
		fail(err)
	}
	if o.nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			fail(fmt.Errorf("no --hostname-override and no host name: %w", err))
		}
		o.nodeName = strings.ToLower(h)
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := newClient(cfg)
	if err != nil {
		fail(err)
	}
	d := &daemon{opts: o, client: client}
	if err := d.run(ctx); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "proxy:", err)
	os.Exit(1)
}
