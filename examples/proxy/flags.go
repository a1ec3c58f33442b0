package main

import (
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	netutils "k8s.io/utils/net"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
)

// options are the command line: kube-proxy's flags, bound to a
// KubeProxyConfiguration as kube-proxy binds them, and proxykit's own.
type options struct {
	// cfg receives the flags bound to the configuration; with --config,
	// the file replaces it (see [options.complete]).
	cfg proxyConfig

	configFile       string
	writeConfigTo    string
	cleanup          bool
	initOnly         bool
	version          string
	master           string
	hostnameOverride string
	healthzPort      int32
	metricsPort      int32
	// kube-proxy's flags that are not fields of the configuration,
	// applied per mode without --config.
	iptablesSyncPeriod, iptablesMinSyncPeriod time.Duration
	ipvsSyncPeriod, ipvsMinSyncPeriod         time.Duration
	clusterCIDRs                              string
	// The logging flags, which win over the file.
	verbosity     uint32
	loggingFormat string
	logFlush      time.Duration

	ext extOptions
}

// extOptions are proxykit's options that KubeProxyConfiguration has no
// place for: flags only, applied with or without --config.
type extOptions struct {
	netns          string
	keepLeftovers  bool
	scheduler      string // --scheduler: the ebpf scheduler; ipvs: an alias of --ipvs-scheduler
	ebpfCgroup     string
	ebpfAllNetNS   bool
	ebpfPinPath    string
	ebpfSocketOnly bool
	dryRun         bool
}

// boundToConfig are the flags kube-proxy binds to its configuration (or
// applies only without a file): with --config they are ignored, as in
// kube-proxy. --backend is our alias of --proxy-mode, --scheduler in
// ipvs mode of --ipvs-scheduler.
var boundToConfig = []string{
	"feature-gates", "kubeconfig", "kube-api-content-type", "kube-api-burst", "kube-api-qps",
	"bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail",
	"profiling", "show-hidden-metrics-for-version", "proxy-mode", "backend",
	"iptables-masquerade-bit", "masquerade-all", "iptables-localhost-nodeports",
	"iptables-sync-period", "iptables-min-sync-period", "ipvs-sync-period", "ipvs-min-sync-period",
	"ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout",
	"detect-local-mode", "pod-bridge-interface", "pod-interface-name-prefix", "cluster-cidr",
	"nodeport-addresses", "oom-score-adj",
	"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait",
	"conntrack-tcp-be-liberal", "conntrack-udp-timeout", "conntrack-udp-timeout-stream", "config-sync-period",
	"healthz-port", "metrics-port",
}

// unsupportedFlags are kube-proxy flags this daemon has no equivalent
// of: using one fails, naming it.
var unsupportedFlags = map[string]string{
	"vmodule":                   "log/slog has one level; use -v",
	"log-text-split-stream":     "logs go to standard error",
	"log-json-split-stream":     "logs go to standard error",
	"log-text-info-buffer-size": "logs are not buffered",
	"log-json-info-buffer-size": "logs are not buffered",
}

// newFlagSet defines kube-proxy's flags, with kube-proxy's names, types
// and defaults, and proxykit's own, on a new flag set bound to o. o.cfg
// must hold [defaultConfig].
func newFlagSet(o *options, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	fs.SetOutput(out)
	// kube-proxy's WordSepNormalizeFunc: "_" is "-".
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
	})
	c := &o.cfg
	const ignored = " This parameter is ignored if a config file is specified by --config."

	fs.StringVar(&o.configFile, "config", "", "The path to the configuration file.")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "If set, write the default configuration values to this file and exit.")
	fs.BoolVar(&o.cleanup, "cleanup", false, "If true cleanup iptables and ipvs rules and exit. (proxykit: what every backend programmed in the namespace)")
	fs.Var(mapStringBool{&c.FeatureGates, new(bool)}, "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n"+strings.Join(knownGateNames(), "\n")+"\n"+ignored)
	fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", c.ClientConnection.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", c.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
	fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", c.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", c.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.Var(ipVar{&c.BindAddress}, "bind-address", "Overrides kube-proxy's idea of what its node's primary IP is. Note that the name is a historical artifact, and kube-proxy does not actually bind any sockets to this IP."+ignored)
	fs.Var(ipPortVar{&c.HealthzBindAddress}, "healthz-bind-address", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\"."+ignored)
	fs.Var(ipPortVar{&c.MetricsBindAddress}, "metrics-bind-address", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". (Set to \"0.0.0.0:10249\" / \"[::]:10249\" to bind on all interfaces.)"+ignored)
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", false, "If true kube-proxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", false, "If true enables profiling via web interface on /debug/pprof handler."+ignored)
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", "The previous version for which you want to show hidden metrics. Only the previous minor version is meaningful, other values will not be allowed. The format is <major>.<minor>, e.g.: '1.16'."+ignored)
	fs.BoolVar(&o.initOnly, "init-only", false, "If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.")
	fs.Var((*stringValue)(&c.Mode), "proxy-mode", "Which proxy mode to use: 'iptables' (default), 'ipvs', 'nftables', or proxykit's 'ebpf'."+ignored)
	fs.Var((*stringValue)(&c.Mode), "backend", "Deprecated alias of --proxy-mode.")
	_ = fs.MarkDeprecated("backend", "use --proxy-mode")

	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].")
	fs.BoolVar(&c.MasqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins. Only supported on Linux.")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)")
	fs.DurationVar(&o.iptablesSyncPeriod, "iptables-sync-period", c.SyncPeriod.Duration, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.iptablesMinSyncPeriod, "iptables-min-sync-period", c.MinSyncPeriod.Duration, "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.")
	fs.DurationVar(&o.ipvsSyncPeriod, "ipvs-sync-period", c.SyncPeriod.Duration, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.ipvsMinSyncPeriod, "ipvs-min-sync-period", c.MinSyncPeriod.Duration, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.")
	fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", "", "The ipvs scheduler type when proxy mode is ipvs")
	fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", nil, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules. (proxykit: not supported)")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", false, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2")
	fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")

	fs.Var((*stringValue)(&c.DetectLocalMode), "detect-local-mode", "Mode to use to detect local traffic."+ignored)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.")
	fs.StringVar(&o.clusterCIDRs, "cluster-cidr", "", "The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range. (Otherwise it is not used.)"+ignored)
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", nil, "A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. If set to a list of CIDRs, connections to NodePort services will only be accepted on node IPs in one of the indicated ranges. If set to 'primary', NodePort services will only be accepted on the node's primary IP(s) according to the Node object. If unset, NodePort connections will be accepted on all local IPs."+ignored)
	fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]."+ignored)
	fs.Int32Var(c.Conntrack.MaxPerCore, "conntrack-max-per-core", *c.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(c.Conntrack.Min, "conntrack-min", *c.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
	fs.DurationVar(&c.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", c.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", c.Conntrack.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state")
	fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
	fs.DurationVar(&c.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")
	fs.Int32Var(&o.healthzPort, "healthz-port", proxyHealthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", proxyStatusPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")

	// Logging (component-base's logsapi.AddFlags): these win over the file.
	fs.Uint32VarP(&o.verbosity, "v", "v", 0, "number for the log level verbosity (proxykit: the slog level is -v: 0 info, 4 and more debug)")
	fs.StringVar(&o.loggingFormat, "logging-format", "text", "Sets the log format. Permitted formats: \"json\", \"text\".")
	fs.DurationVar(&o.logFlush, "log-flush-frequency", 5*time.Second, "Maximum number of seconds between log flushes (proxykit: logs are not buffered)")
	for _, name := range slices.Sorted(maps.Keys(unsupportedFlags)) {
		fs.String(name, "", "not supported by proxykit: "+unsupportedFlags[name])
	}
	// cadvisor's flags, which kube-proxy has and does not use on Linux.
	fs.String("boot-id-file", "/proc/sys/kernel/random/boot_id", "Comma-separated list of files to check for boot-id. Use the first one that exists. (unused)")
	fs.String("machine-id-file", "/etc/machine-id,/var/lib/dbus/machine-id", "Comma-separated list of files to check for machine-id. Use the first one that exists. (unused)")
	fs.StringVar(&o.version, "version", "false", "--version, --version=raw prints version information and quits")
	fs.Lookup("version").NoOptDefVal = "true"

	// proxykit's own.
	fs.StringVar(&o.ext.netns, "netns", "", "proxykit: program this network namespace (a path like /var/run/netns/x) instead of the process's own")
	fs.BoolVar(&o.ext.keepLeftovers, "keep-leftovers", false, "proxykit: do not remove, once synced, what other backends left in the namespace")
	fs.StringVar(&o.ext.scheduler, "scheduler", "", "proxykit: load-balancing algorithm of the ebpf backend (random or maglev; default random); in ipvs mode an alias of --ipvs-scheduler; nftables and iptables pick at random")
	fs.StringVar(&o.ext.ebpfCgroup, "ebpf-cgroup", "/sys/fs/cgroup", "proxykit, ebpf: the cgroup v2 directory whose processes' sockets are translated")
	fs.BoolVar(&o.ext.ebpfAllNetNS, "ebpf-all-netns", true, "proxykit, ebpf: translate the sockets of every network namespace under --ebpf-cgroup (the pods'), not only the node's")
	fs.StringVar(&o.ext.ebpfPinPath, "ebpf-pin-path", "", "proxykit, ebpf: a directory on a bpffs where maps and links are pinned, so that a restart adopts them and --cleanup finds them; empty: nothing pinned")
	fs.BoolVar(&o.ext.dryRun, "dry-run", false, "proxykit: print the node settings the configuration would change and what the mode's backend would program once the initial Services and EndpointSlices arrive, then exit; change nothing")
	fs.BoolVar(&o.ext.ebpfSocketOnly, "ebpf-socket-only", false, "proxykit, ebpf: only the socket programs, without the nftables table for traffic from outside the node")
	return fs
}

// parseFlags parses args into a new options; the flag set tells which
// flags were given.
func parseFlags(args []string, out io.Writer) (*options, *pflag.FlagSet, error) {
	o := &options{cfg: defaultConfig()}
	fs := newFlagSet(o, out)
	if err := fs.Parse(args); err != nil {
		return nil, fs, err
	}
	if fs.NArg() > 0 {
		return nil, fs, fmt.Errorf("%q does not take any arguments, got %q", "proxy", fs.Args())
	}
	for name, why := range unsupportedFlags {
		if fs.Changed(name) {
			return nil, fs, fmt.Errorf("--%s: not supported by proxykit (%s)", name, why)
		}
	}
	return o, fs, nil
}

// stringValue is a string flag of a named string type (ProxyMode,
// LocalMode).
type stringValue string

func (s *stringValue) String() string     { return string(*s) }
func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) Type() string       { return "string" }

// ipVar is kube-proxy's IPVar: an IP; empty leaves the value alone.
type ipVar struct{ v *string }

func (f ipVar) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f ipVar) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) == nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*f.v = s
	return nil
}

func (ipVar) Type() string { return "ip" }

// ipPortVar is kube-proxy's IPPortVar: an IP or IP:port; empty leaves
// the value alone.
type ipPortVar struct{ v *string }

func (f ipPortVar) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f ipPortVar) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) != nil {
		*f.v = s
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not in a valid format (ip or ip:port): %v", s, err)
	}
	if netutils.ParseIPSloppy(host) == nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if _, err := netutils.ParsePort(port, true); err != nil {
		return fmt.Errorf("%q is not a valid number", port)
	}
	*f.v = s
	return nil
}

func (ipPortVar) Type() string { return "ipport" }

// mapStringBool is component-base's MapStringBool: k=v pairs, comma
// separated; the first Set replaces the default map, later ones add.
type mapStringBool struct {
	m    *map[string]bool
	init *bool // set once the first Set replaced the default
}

func (f mapStringBool) String() string {
	if f.m == nil {
		return ""
	}
	var s []string
	for _, k := range slices.Sorted(maps.Keys(*f.m)) {
		s = append(s, k+"="+strconv.FormatBool((*f.m)[k]))
	}
	return strings.Join(s, ",")
}

func (f mapStringBool) Set(v string) error {
	if !*f.init {
		*f.m = map[string]bool{}
		*f.init = true
	}
	for _, s := range strings.Split(v, ",") {
		if s == "" {
			continue
		}
		k, val, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("malformed pair, expect string=bool")
		}
		k = strings.TrimSpace(k)
		val = strings.TrimSpace(val)
		b, err := strconv.ParseBool(val)
		if err != nil {
			return fmt.Errorf("invalid value of %s=%s, err: %v", k, val, err)
		}
		(*f.m)[k] = b
	}
	return nil
}

func (mapStringBool) Type() string { return "mapStringBool" }

// schedulerOf returns the canonical name of a scheduler given by name,
// or an error naming what set it.
func schedulerOf(name, what string) (proxier.Scheduler, error) {
	if name == "" {
		return "", nil
	}
	s, ok := proxier.Scheduler(name).Canonical()
	if !ok {
		return "", fmt.Errorf("%s %q: unknown scheduler", what, name)
	}
	return s, nil
}

// modeNames lists the modes for messages.
func modeNames() string { return strings.Join(backends.Names(), ", ") }
