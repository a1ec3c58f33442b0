package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/events"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/version"
	nodeutil "k8s.io/component-helpers/node/util"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/proxy"
	proxyconfigapi "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/conntrack"
	"k8s.io/kubernetes/pkg/proxy/healthcheck"
	"k8s.io/kubernetes/pkg/proxy/iptables"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	utiliptables "k8s.io/kubernetes/pkg/util/iptables"
	netutils "k8s.io/utils/net"
)

// Defaults of kube-proxy's configuration (v1alpha1) that the oracle keeps.
const (
	syncPeriod    = 30 * time.Second // retry interval, iptables canary check
	minSyncPeriod = 1 * time.Second  // unused: the oracle syncs itself
)

func main() {
	if err := run(); errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		klog.ErrorS(err, "kube-proxy-oracle failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run() error {
	// Keep the real standard output for the protocol and point file
	// descriptor 1 at standard error, so nothing else (a library, a child
	// process) can write a stray line into the protocol.
	protoFd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return fmt.Errorf("duplicate stdout: %w", err)
	}
	if err := unix.Dup3(2, 1, 0); err != nil {
		return fmt.Errorf("redirect stdout to stderr: %w", err)
	}
	out := os.NewFile(uintptr(protoFd), "protocol")

	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		return err
	}
	if err := checkNetNS(cfg.netns); err != nil {
		return err
	}
	o, err := newOracle(cfg)
	if err != nil {
		return err
	}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 1024*1024)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		cmd, arg, _ := strings.Cut(line, " ")
		arg = strings.TrimSpace(arg)
		var answer string
		switch {
		case line == "":
			continue
		case cmd == "quit":
			return nil
		case cmd == "apply" && arg != "":
			start := time.Now()
			if err := o.apply(arg); err != nil {
				klog.ErrorS(err, "apply failed", "path", arg)
				answer = "error: " + oneLine(err.Error())
			} else {
				klog.InfoS("Applied and synced", "path", arg, "elapsed", time.Since(start))
				answer = "synced"
			}
		default:
			answer = fmt.Sprintf("error: unknown command %q (want \"apply PATH\" or \"quit\")", line)
		}
		if _, err := fmt.Fprintln(out, answer); err != nil {
			return fmt.Errorf("write answer: %w", err)
		}
	}
	return in.Err() // nil at the end of stdin
}

// config is the command line.
type config struct {
	mode               proxyconfigapi.ProxyMode
	nodeName           string
	primaryFamily      v1.IPFamily
	nodeIPs            map[v1.IPFamily]net.IP
	dualStack          bool
	clusterCIDRs       []string
	nodePortAddresses  []string
	masqueradeAll      bool
	masqueradeBit      int
	localhostNodePorts bool
	serviceCIDRs       []string
	nodeLabels         map[string]string
	netns              string // the namespace the oracle must be in, if given
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("kube-proxy-oracle", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kube-proxy-oracle --node-ips IP[,IP] [flags] (in a throwaway network namespace)\n"+
			"Reads \"apply PATH\" and \"quit\" lines on stdin and answers \"synced\" or \"error: ...\" on stdout.\n")
		fs.PrintDefaults()
	}
	klog.InitFlags(fs) // --v and friends; klog logs to stderr by default
	mode := fs.String("proxy-mode", "nftables", "which proxier to run: nftables or iptables")
	hostname := fs.String("hostname-override", "", "the node's name (default: the host name)")
	nodeIPs := fs.String("node-ips", "", "the node's primary IP per family, comma-separated, primary family first; both families make the oracle dual-stack (kube-proxy's metaproxier), one family single-stack")
	clusterCIDRs := fs.String("cluster-cidr", "", "comma-separated pod network CIDRs (detect-local-mode ClusterCIDR)")
	nodePortAddresses := fs.String("nodeport-addresses", "", "comma-separated CIDRs, or \"primary\", where NodePorts are served (default: \"primary\" in nftables mode, all addresses in iptables mode)")
	masqueradeAll := fs.Bool("masquerade-all", false, "SNAT all traffic sent via Service cluster IPs")
	masqueradeBit := fs.Int("masquerade-bit", 14, "the bit of the packet mark that marks packets to masquerade [0, 31]")
	localhostNodePorts := fs.Bool("iptables-localhost-nodeports", true, "iptables mode: accept NodePort connections to 127.0.0.1 (sets route_localnet)")
	serviceCIDRs := fs.String("service-cidrs", "", "comma-separated service CIDRs, as the default ServiceCIDR object \"kubernetes\" the API server creates from --service-cluster-ip-range; ServiceCIDR objects in applied files add to them")
	netnsPath := fs.String("netns", "", "the path of the network namespace the oracle must find itself in (e.g. /run/netns/NAME); it refuses to run anywhere else")
	nodeLabels := fs.String("node-labels", "", "comma-separated key=value labels of the node (topology.kubernetes.io/zone matters)")
	featureGates := map[string]bool{}
	fs.Var(cliflag.NewMapStringBool(&featureGates), "feature-gates", "comma-separated Feature=bool pairs, as kube-proxy's --feature-gates")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(featureGates); err != nil {
		return nil, fmt.Errorf("--feature-gates: %w", err)
	}

	c := &config{
		mode:               proxyconfigapi.ProxyMode(*mode),
		masqueradeAll:      *masqueradeAll,
		masqueradeBit:      *masqueradeBit,
		localhostNodePorts: *localhostNodePorts,
		netns:              *netnsPath,
		clusterCIDRs:       splitList(*clusterCIDRs),
		nodePortAddresses:  splitList(*nodePortAddresses),
		serviceCIDRs:       splitList(*serviceCIDRs),
		nodeLabels:         map[string]string{},
	}
	if c.mode != proxyconfigapi.ProxyModeNFTables && c.mode != proxyconfigapi.ProxyModeIPTables {
		return nil, fmt.Errorf("--proxy-mode: %q is neither nftables nor iptables", *mode)
	}
	if c.masqueradeBit < 0 || c.masqueradeBit > 31 {
		return nil, fmt.Errorf("--masquerade-bit: %d is not in [0, 31]", c.masqueradeBit)
	}
	var err error
	if c.nodeName, err = nodeutil.GetHostname(*hostname); err != nil {
		return nil, err
	}

	// The node IPs, as kube-proxy's detectNodeIPs: the first is primary,
	// a family without one falls back to loopback.
	c.nodeIPs = map[v1.IPFamily]net.IP{v1.IPv4Protocol: net.IPv4(127, 0, 0, 1), v1.IPv6Protocol: net.IPv6loopback}
	ips := splitList(*nodeIPs)
	if len(ips) == 0 || len(ips) > 2 {
		return nil, fmt.Errorf("--node-ips: want one or two IPs, got %q", *nodeIPs)
	}
	families := map[v1.IPFamily]bool{}
	for i, s := range ips {
		ip := netutils.ParseIPSloppy(s)
		if ip == nil {
			return nil, fmt.Errorf("--node-ips: %q is not an IP", s)
		}
		f := familyOf(ip)
		if families[f] {
			return nil, fmt.Errorf("--node-ips: two %s addresses", f)
		}
		families[f] = true
		c.nodeIPs[f] = ip
		if i == 0 {
			c.primaryFamily = f
		}
	}
	c.dualStack = len(families) == 2

	for _, s := range c.clusterCIDRs {
		if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
			return nil, fmt.Errorf("--cluster-cidr: %w", err)
		}
	}
	for _, s := range c.serviceCIDRs {
		if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
			return nil, fmt.Errorf("--service-cidrs: %w", err)
		}
	}

	// NodePort addresses as kube-proxy's platformApplyDefaults and
	// newProxyServer: nftables mode defaults to "primary", which becomes
	// the node IPs as /32 and /128.
	if c.mode == proxyconfigapi.ProxyModeNFTables && len(c.nodePortAddresses) == 0 {
		c.nodePortAddresses = []string{proxyconfigapi.NodePortAddressesPrimary}
	}
	if len(c.nodePortAddresses) == 1 && c.nodePortAddresses[0] == proxyconfigapi.NodePortAddressesPrimary {
		c.nodePortAddresses = nil
		if ip := c.nodeIPs[v1.IPv4Protocol]; !ip.IsLoopback() {
			c.nodePortAddresses = append(c.nodePortAddresses, ip.String()+"/32")
		}
		if ip := c.nodeIPs[v1.IPv6Protocol]; !ip.IsLoopback() {
			c.nodePortAddresses = append(c.nodePortAddresses, ip.String()+"/128")
		}
	} else {
		for _, s := range c.nodePortAddresses {
			if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
				return nil, fmt.Errorf("--nodeport-addresses: %q is neither a CIDR nor a lone \"primary\"", s)
			}
		}
	}

	for _, kv := range splitList(*nodeLabels) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-labels: %q is not key=value", kv)
		}
		c.nodeLabels[k] = v
	}
	return c, nil
}

// checkNetNS refuses to run in the host's network namespace: the oracle
// rewrites the netfilter rules and sysctls of its namespace. With
// want (--netns) it must be in that namespace; the host's is PID 1's
// when that is readable (a sandbox may hide it even from root), else,
// without want, the parent's: whoever started the oracle must have
// entered another namespace for it (nsenter and ip netns exec exec the
// oracle themselves, so the parent is the caller outside). A caller that
// forks the oracle from a thread inside the namespace passes want, as its
// process may be anywhere.
func checkNetNS(want string) error {
	var self, host, target unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return fmt.Errorf("own network namespace: %w", err)
	}
	if want != "" {
		if err := unix.Stat(want, &target); err != nil {
			return fmt.Errorf("--netns: %w", err)
		}
		if self.Dev != target.Dev || self.Ino != target.Ino {
			return fmt.Errorf("refusing to run: not in the network namespace %s (--netns)", want)
		}
	}
	whose := "PID 1"
	if err := unix.Stat("/proc/1/ns/net", &host); err != nil {
		if want != "" {
			return nil
		}
		whose = "the parent process"
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", os.Getppid()), &host); err != nil {
			return fmt.Errorf("network namespace of neither PID 1 nor the parent is readable: %w", err)
		}
	}
	if self.Dev == host.Dev && self.Ino == host.Ino {
		return fmt.Errorf("refusing to run in the network namespace of %s; start me in a throwaway one (nsenter --net=/run/netns/NAME or ip netns exec NAME)", whose)
	}
	return nil
}

// oracle is the proxier and the objects delivered to it.
type oracle struct {
	provider proxy.Provider
	healthz  *healthcheck.ProxyHealthServer
	families []v1.IPFamily // the families with a proxier
	cfg      *config

	started   bool // the first apply delivered its objects
	services  map[string]*v1.Service
	slices    map[string]*discovery.EndpointSlice
	lastCIDRs []string
}

// node stands for the Node object of kube-proxy's node informer; the
// healthz server asks it whether the node is being deleted.
type node struct{ obj *v1.Node }

func (n node) Node() *v1.Node { return n.obj.DeepCopy() }

// newOracle creates the proxier as kube-proxy's newProxyServer and
// createProxier do, minus the API server.
func newOracle(c *config) (*oracle, error) {
	ctx := context.Background() // klog.FromContext falls back to the global logger
	nodeObj := &v1.Node{}
	nodeObj.Name = c.nodeName
	nodeObj.Labels = c.nodeLabels

	// The healthz server is never served: the oracle reads its "last
	// updated" time per family, which a successful syncProxyRules sets.
	hz := healthcheck.NewProxyHealthServer("127.0.0.1:0", 2*syncPeriod, node{nodeObj})
	recorder := &events.FakeRecorder{} // nil channel: events are dropped

	// kube-proxy's platformSetup sets conntrack sysctls. Only the
	// per-namespace ones are set here (TCP timeouts, kube-proxy's
	// defaults): nf_conntrack_max and the nf_conntrack hashsize module
	// parameter are host-wide.
	if err := conntrack.SetSysctls(ctx, &proxyconfigapi.KubeProxyConntrackConfiguration{
		TCPEstablishedTimeout: durationPtr(24 * time.Hour),
		TCPCloseWaitTimeout:   durationPtr(time.Hour),
	}); err != nil {
		klog.InfoS("Could not set conntrack sysctls (continuing)", "err", err)
	}

	// Local traffic detection, as kube-proxy's getLocalDetectors with
	// detect-local-mode ClusterCIDR.
	detectors := map[v1.IPFamily]proxyutil.LocalTrafficDetector{
		v1.IPv4Protocol: proxyutil.NewNoOpLocalDetector(),
		v1.IPv6Protocol: proxyutil.NewNoOpLocalDetector(),
	}
	for f, cidrs := range proxyutil.MapCIDRsByIPFamily(c.clusterCIDRs) {
		detectors[f] = proxyutil.NewDetectLocalByCIDR(cidrs[0].String())
	}

	o := &oracle{
		healthz:  hz,
		cfg:      c,
		services: map[string]*v1.Service{},
		slices:   map[string]*discovery.EndpointSlice{},
	}
	var err error
	switch {
	case c.mode == proxyconfigapi.ProxyModeNFTables && c.dualStack:
		o.families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		o.provider, err = nftables.NewDualStackProxier(ctx, syncPeriod, minSyncPeriod,
			c.masqueradeAll, c.masqueradeBit, detectors, c.nodeName, c.nodeIPs,
			recorder, hz, c.nodePortAddresses, false)
	case c.mode == proxyconfigapi.ProxyModeNFTables:
		o.families = []v1.IPFamily{c.primaryFamily}
		o.provider, err = nftables.NewProxier(ctx, c.primaryFamily, syncPeriod, minSyncPeriod,
			c.masqueradeAll, c.masqueradeBit, detectors[c.primaryFamily], c.nodeName,
			c.nodeIPs[c.primaryFamily], recorder, hz, c.nodePortAddresses, false)
	case c.dualStack:
		ipts := utiliptables.NewBestEffort()
		for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if ipts[f] == nil {
				return nil, fmt.Errorf("no usable iptables for %s", f)
			}
		}
		o.families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		o.provider, err = iptables.NewDualStackProxier(ctx, ipts, utilsysctl.New(), syncPeriod, minSyncPeriod,
			c.masqueradeAll, c.localhostNodePorts, c.masqueradeBit, detectors, c.nodeName, c.nodeIPs,
			recorder, hz, c.nodePortAddresses, false)
	default:
		ipt := utiliptables.NewBestEffort()[c.primaryFamily]
		if ipt == nil {
			return nil, fmt.Errorf("no usable iptables for %s", c.primaryFamily)
		}
		o.families = []v1.IPFamily{c.primaryFamily}
		o.provider, err = iptables.NewProxier(ctx, c.primaryFamily, ipt, utilsysctl.New(), syncPeriod, minSyncPeriod,
			c.masqueradeAll, c.localhostNodePorts, c.masqueradeBit, detectors[c.primaryFamily], c.nodeName,
			c.nodeIPs[c.primaryFamily], recorder, hz, c.nodePortAddresses, false)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s proxier: %w", c.mode, err)
	}
	klog.InfoS("Created proxier", "version", version.Get().GitVersion, "mode", c.mode, "families", o.families, "node", c.nodeName,
		"nodeIPs", c.nodeIPs, "nodePortAddresses", c.nodePortAddresses, "clusterCIDRs", c.clusterCIDRs)

	// The node's topology labels, as kube-proxy's NodeTopologyConfig
	// delivers them from the node informer: only the zone, and only when
	// it differs from the initial empty set.
	if zone, ok := c.nodeLabels[v1.LabelTopologyZone]; ok {
		o.provider.OnTopologyChange(map[string]string{v1.LabelTopologyZone: zone})
	}
	// SyncLoop is never started: its BoundedFrequencyRunner would sync at
	// times of its own choosing. The oracle syncs synchronously instead
	// (see sync), so Sync() calls from the event handlers only fill the
	// runner's one-slot channel, which nothing reads.
	return o, nil
}

// apply delivers the objects of a file and syncs.
func (o *oracle) apply(path string) error {
	objs, err := loadFile(path)
	if err != nil {
		return err
	}
	svcs, slcs := map[string]*v1.Service{}, map[string]*discovery.EndpointSlice{}
	cidrs := append([]string(nil), o.cfg.serviceCIDRs...)
	for _, obj := range objs {
		switch x := obj.(type) {
		case *v1.Service:
			// kube-proxy's Service informer selects neither
			// headless Services nor those of another proxy.
			if _, other := x.Labels["service.kubernetes.io/service-proxy-name"]; other || x.Spec.ClusterIP == v1.ClusterIPNone {
				continue
			}
			svcs[x.Namespace+"/"+x.Name] = x
		case *discovery.EndpointSlice:
			// Nor does its EndpointSlice informer select the
			// slices of headless Services.
			if _, headless := x.Labels[v1.IsHeadlessService]; headless {
				continue
			}
			slcs[x.Namespace+"/"+x.Name] = x
		case *networkingv1.ServiceCIDR:
			cidrs = append(cidrs, x.Spec.CIDRs...)
		}
	}
	slices.Sort(cidrs)
	cidrs = slices.Compact(cidrs)

	// ServiceCIDRConfig hands over the union of all ServiceCIDRs on every
	// change (and once when its informer has synced).
	if !o.started || !slices.Equal(cidrs, o.lastCIDRs) {
		o.provider.OnServiceCIDRsChanged(cidrs)
		o.lastCIDRs = cidrs
	}
	deliver(o.services, svcs, o.provider.OnServiceAdd, o.provider.OnServiceUpdate, o.provider.OnServiceDelete)
	deliver(o.slices, slcs, o.provider.OnEndpointSliceAdd, o.provider.OnEndpointSliceUpdate, o.provider.OnEndpointSliceDelete)
	o.services, o.slices = svcs, slcs

	before := o.lastUpdated()
	if !o.started {
		// As kube-proxy's ServiceConfig and EndpointSliceConfig once
		// their informers have synced. Each call runs syncProxyRules
		// synchronously; the second one, with both sets synced, is the
		// first real sync.
		o.started = true
		o.provider.OnServiceSynced()
		o.provider.OnEndpointSlicesSynced()
	} else {
		// In v1.36 OnServiceSynced runs syncProxyRules synchronously
		// in the calling goroutine, for each family (metaproxier), on
		// every call. Nothing else syncs (no SyncLoop), so the changes
		// delivered above are in this sync.
		o.provider.OnServiceSynced()
	}
	// syncProxyRules calls the healthz server's Updated(family) after
	// the transaction (nft -f / iptables-restore) succeeded, and only
	// then.
	after := o.lastUpdated()
	var failed []string
	for _, f := range o.families {
		if !after[f].After(before[f]) {
			failed = append(failed, string(f))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s sync of %s rules failed; kube-proxy's log on stderr has the reason", o.cfg.mode, strings.Join(failed, " and "))
	}
	return nil
}

// lastUpdated returns the time of the last successful sync per family.
func (o *oracle) lastUpdated() map[v1.IPFamily]time.Time {
	m := map[v1.IPFamily]time.Time{}
	for f, h := range o.healthz.Health().Status {
		m[f] = h.LastUpdated
	}
	return m
}

// deliver calls the handlers for the differences between two sets of
// objects keyed by namespace/name, in a stable order, as an informer would:
// deletions, then updates of objects that changed, then additions.
func deliver[T any](old, cur map[string]T, add func(T), update func(T, T), del func(T)) {
	for _, k := range sortedKeys(old) {
		if _, ok := cur[k]; !ok {
			del(old[k])
		}
	}
	for _, k := range sortedKeys(cur) {
		if prev, ok := old[k]; ok {
			if !semanticEqual(prev, cur[k]) {
				update(prev, cur[k])
			}
		}
	}
	for _, k := range sortedKeys(cur) {
		if _, ok := old[k]; !ok {
			add(cur[k])
		}
	}
}

func sortedKeys[T any](m map[string]T) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func familyOf(ip net.IP) v1.IPFamily {
	if netutils.IsIPv4(ip) {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
