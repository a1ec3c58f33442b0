package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	netutils "k8s.io/utils/net"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
)

// checkScheduler refuses a scheduler the mode's backend cannot take:
// nftables and iptables pick at random, ipvs takes IPVS's names, ebpf
// random or maglev (the backends refuse the rest when built; this names
// the setting before anything starts).
func checkScheduler(c *proxyConfig, ext extOptions) error {
	s, err := schedulerOf(ext.scheduler, "--scheduler")
	if err != nil {
		return err
	}
	switch c.Mode {
	case modeNFTables, modeIPTables:
		if s != "" && s != proxier.SchedulerRandom {
			return fmt.Errorf("--scheduler %s: the %s backend picks endpoints at random; schedulers are for ipvs and ebpf", ext.scheduler, c.Mode)
		}
	case modeIPVS:
		if _, err := schedulerOf(c.IPVS.Scheduler, "ipvs.scheduler"); err != nil {
			return err
		}
	}
	return nil
}

// nodeInfo is what the configuration needs of the Node object at start:
// its primary addresses (for nodePortAddresses "primary") and pod CIDRs
// (for detectLocalMode NodeCIDR).
type nodeInfo struct {
	ips      []netip.Addr // the first of each family, InternalIP else ExternalIP
	podCIDRs []string
}

// How long the start waits for the Node's addresses and pod CIDRs, as
// kube-proxy's NodeManager.
var (
	nodeIPsTimeout  = 30 * time.Second
	podCIDRsTimeout = 5 * time.Minute
	nodePoll        = time.Second
)

// needsNode reports whether the configuration needs the Node object
// before the proxier starts.
func (c *proxyConfig) needsNode() bool {
	return c.DetectLocalMode == localNodeCIDR || slices.Equal(c.NodePortAddresses, []string{nodePortAddressesPrimary})
}

// waitNode reads this node's Node object as kube-proxy's NodeManager
// does: it waits up to 30 s for its addresses (and goes on without them,
// logging it), and in NodeCIDR mode up to 5 minutes for its pod CIDRs
// (failing without them).
func waitNode(ctx context.Context, client kubernetes.Interface, name string, wantPodCIDRs bool, log *slog.Logger) (nodeInfo, error) {
	var (
		node *v1.Node
		info nodeInfo
	)
	get := func() {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				log.Debug("reading the Node", "node", name, "err", err)
			}
			return
		}
		node, info = n, nodeInfo{ips: nodeHostIPs(n), podCIDRs: n.Spec.PodCIDRs}
	}
	poll := func(timeout time.Duration, done func() bool) {
		deadline := time.Now().Add(timeout)
		for get(); !done() && time.Now().Before(deadline) && ctx.Err() == nil; get() {
			select {
			case <-ctx.Done():
			case <-time.After(nodePoll):
			}
		}
	}
	poll(nodeIPsTimeout, func() bool { return len(info.ips) > 0 })
	if wantPodCIDRs && len(info.podCIDRs) == 0 {
		poll(podCIDRsTimeout, func() bool { return len(info.podCIDRs) > 0 })
		if len(info.podCIDRs) == 0 {
			if node == nil {
				return info, fmt.Errorf("timeout waiting for node %q to exist", name)
			}
			return info, fmt.Errorf("timeout waiting for PodCIDR allocation on node %q", name)
		}
	}
	switch {
	case node == nil:
		log.Error("Timed out waiting for node to exist", "node", name)
	case len(info.ips) == 0:
		log.Error("Timed out waiting for node to be assigned IPs", "node", name)
	default:
		log.Info("Successfully retrieved NodeIPs", "NodeIPs", info.ips)
	}
	return info, nil
}

// nodeHostIPs returns the Node's addresses as kube-proxy's
// GetNodeHostIPs: the first InternalIP, else ExternalIP, of the first
// family listed, then of the other.
func nodeHostIPs(n *v1.Node) []netip.Addr {
	var ips []netip.Addr
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != t {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				continue
			}
			ip = ip.Unmap()
			if len(ips) == 0 || (len(ips) == 1 && ips[0].Is4() != ip.Is4()) {
				ips = append(ips, ip)
			}
		}
		if len(ips) > 0 {
			// kube-proxy's GetNodeHostIPs takes both families from the
			// InternalIPs when there is one.
			break
		}
	}
	return ips
}

// primaryIPs returns the node's primary IP per family as kube-proxy's
// detectNodeIPs: the Node's, with --bind-address (when specified)
// overriding its family's. Loopback stands for unknown and is dropped.
func primaryIPs(c *proxyConfig, info nodeInfo) []netip.Addr {
	ips := slices.Clone(info.ips)
	if bind := netutils.ParseIPSloppy(c.BindAddress); bind != nil && !bind.IsUnspecified() {
		b, _ := netip.AddrFromSlice(bind)
		b = b.Unmap()
		ips = slices.DeleteFunc(ips, func(a netip.Addr) bool { return a.Is4() == b.Is4() })
		ips = append([]netip.Addr{b}, ips...)
	}
	return slices.DeleteFunc(ips, netip.Addr.IsLoopback)
}

// parseCIDRs parses CIDRs as kube-proxy does (leading zeros allowed),
// masked.
func parseCIDRs(ss []string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for _, s := range ss {
		_, n, err := netutils.ParseCIDRSloppy(s)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		a, _ := netip.AddrFromSlice(n.IP)
		ones, _ := n.Mask.Size()
		ps = append(ps, netip.PrefixFrom(a.Unmap(), ones).Masked())
	}
	return ps, nil
}

// firstPerFamily keeps the first prefix of each family, as kube-proxy's
// local-traffic detectors use.
func firstPerFamily(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Addr().Is4() == p.Addr().Is4() }) {
			out = append(out, p)
		}
	}
	return out
}

// backendConfig maps the resolved configuration to the registry's: the
// common proxier.Config and the mode's section, as kube-proxy's
// createProxier reads its configuration. info is the Node at start (for
// "primary" and NodeCIDR).
func (s *settings) backendConfig(info nodeInfo, reg prometheus.Registerer) (backends.Config, error) {
	c := &s.cfg
	pc := proxier.Config{
		NetNS:         s.ext.netns,
		NodeName:      c.HostnameOverride,
		MasqueradeAll: c.MasqueradeAll,
		SyncPeriod:    c.SyncPeriod.Duration,
		// kube-proxy's health timeout is twice the sync period.
		HealthTimeout: 2 * c.SyncPeriod.Duration,
		Logger:        s.log,
		Registerer:    reg,
	}
	pc.MinSyncInterval = c.MinSyncPeriod.Duration
	if pc.MinSyncInterval == 0 {
		// 0 means sync at once in kube-proxy, the default (1s) in
		// proxier.Config.
		pc.MinSyncInterval = time.Nanosecond
	}
	if bind := netutils.ParseIPSloppy(c.BindAddress); bind != nil && !bind.IsUnspecified() {
		b, _ := netip.AddrFromSlice(bind)
		pc.NodeIPs = []netip.Addr{b.Unmap()}
	}

	switch c.DetectLocalMode {
	case localClusterCIDR:
		ps, err := parseCIDRs(c.ClusterCIDRs)
		if err != nil {
			return backends.Config{}, fmt.Errorf("clusterCIDR: %w", err)
		}
		pc.ClusterCIDRs = firstPerFamily(ps)
		if len(pc.ClusterCIDRs) == 0 {
			s.log.Info("Detect-local-mode set to ClusterCIDR, but no cluster CIDR specified for primary IP family")
		}
	case localNodeCIDR:
		ps, err := parseCIDRs(info.podCIDRs)
		if err != nil {
			return backends.Config{}, fmt.Errorf("the Node's podCIDRs: %w", err)
		}
		pc.ClusterCIDRs = firstPerFamily(ps)
	}

	if slices.Equal(c.NodePortAddresses, []string{nodePortAddressesPrimary}) {
		for _, ip := range primaryIPs(c, info) {
			pc.NodePortAddresses = append(pc.NodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
		}
		if len(pc.NodePortAddresses) == 0 {
			s.log.Info("Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag")
		}
	} else {
		ps, err := parseCIDRs(c.NodePortAddresses)
		if err != nil {
			return backends.Config{}, fmt.Errorf("nodePortAddresses: %w", err)
		}
		pc.NodePortAddresses = ps
		if len(ps) == 0 {
			s.log.Info("nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`")
		}
	}

	cfg := backends.Config{Config: pc}
	cfg.NFTables.MasqueradeBit = 1 << uint32(*c.NFTables.MasqueradeBit)
	cfg.IPTables.MasqueradeBit = 1 << uint32(*c.IPTables.MasqueradeBit)
	cfg.IPTables.NoLocalhostNodePorts = !*c.IPTables.LocalhostNodePorts
	cfg.IPVS.MasqueradeBit = 1 << uint32(*c.IPTables.MasqueradeBit)
	sched, err := schedulerOf(c.IPVS.Scheduler, "ipvs.scheduler")
	if err != nil {
		return backends.Config{}, err
	}
	cfg.IPVS.Scheduler = sched
	cfg.IPVS.StrictARP = c.IPVS.StrictARP
	cfg.IPVS.TCPTimeout = c.IPVS.TCPTimeout.Duration
	cfg.IPVS.TCPFinTimeout = c.IPVS.TCPFinTimeout.Duration
	cfg.IPVS.UDPTimeout = c.IPVS.UDPTimeout.Duration
	if cfg.EBPF.Scheduler, err = schedulerOf(s.ext.scheduler, "--scheduler"); err != nil {
		return backends.Config{}, err
	}
	cfg.EBPF.CgroupPath = s.ext.ebpfCgroup
	cfg.EBPF.AllNetNS = s.ext.ebpfAllNetNS
	cfg.EBPF.PinPath = s.ext.ebpfPinPath
	cfg.EBPF.SocketOnly = s.ext.ebpfSocketOnly
	return cfg, nil
}

// cleanupConfig is the registry configuration --cleanup removes under:
// the namespace and the names each section gives (e.g. the pin path).
func (s *settings) cleanupConfig() backends.Config {
	cfg := backends.Config{Config: proxier.Config{NetNS: s.ext.netns, Logger: s.log}}
	cfg.EBPF.PinPath = s.ext.ebpfPinPath
	cfg.EBPF.CgroupPath = s.ext.ebpfCgroup
	return cfg
}

// listenAddr returns addr for net.Listen, as kube-proxy's MultiListen
// takes it.
func listenAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := netutils.ParseIPSloppy(host); ip != nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, port)
}
