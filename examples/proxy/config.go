package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// The proxy modes: kube-proxy's three Linux modes and proxykit's ebpf.
const (
	modeIPTables = "iptables"
	modeIPVS     = "ipvs"
	modeNFTables = "nftables"
	modeEBPF     = "ebpf"
)

// The detect-local modes of KubeProxyConfiguration.detectLocalMode.
const (
	localClusterCIDR         = "ClusterCIDR"
	localNodeCIDR            = "NodeCIDR"
	localBridgeInterface     = "BridgeInterface"
	localInterfaceNamePrefix = "InterfaceNamePrefix"
)

// nodePortAddressesPrimary is the nodePortAddresses keyword for the
// node's primary addresses.
const nodePortAddressesPrimary = "primary"

// kube-proxy's ports (k8s.io/kubernetes/pkg/cluster/ports).
const (
	proxyHealthzPort = 10256
	proxyStatusPort  = 10249
)

// kubeProxyOOMScoreAdj is kube-proxy's default oomScoreAdj.
const kubeProxyOOMScoreAdj = -999

// emulatedMinor is the kube-proxy minor version whose behaviour this
// daemon follows (its configuration, flags and endpoints).
const emulatedMinor = "1.36"

// proxyConfig is a KubeProxyConfiguration in kube-proxy's internal shape,
// the one its flags are bound to and its validation reads: the
// v1alpha1 fields, except that the sync periods and masqueradeAll of the
// mode's section and the split clusterCIDR live outside the sections.
// The embedded sections' SyncPeriod, MinSyncPeriod and MasqueradeAll are
// unused (zero). [internalize] and [proxyConfig.external] convert as
// kube-proxy's conversion functions do, so that --write-config-to and
// /configz print what kube-proxy would.
type proxyConfig struct {
	kpv1.KubeProxyConfiguration
	// SyncPeriod is the full resync interval of the mode.
	SyncPeriod metav1.Duration
	// MinSyncPeriod is the least time between two syncs of the mode.
	MinSyncPeriod metav1.Duration
	// MasqueradeAll masquerades all service traffic.
	MasqueradeAll bool
	// ClusterCIDRs is clusterCIDR split on ",".
	ClusterCIDRs []string
}

// scheme knows KubeProxyConfiguration v1alpha1, the one version there is.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := kpv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// The codecs of config files: strict first, lenient when strict decoding
// failed on an unknown or duplicate field, as kube-proxy decodes.
var (
	strictCodecs  = serializer.NewCodecFactory(scheme, serializer.EnableStrict)
	lenientCodecs = serializer.NewCodecFactory(scheme, serializer.DisableStrict)
)

// setDefaults fills in obj as kube-proxy's SetDefaults_KubeProxyConfiguration
// (pkg/proxy/apis/config/v1alpha1/defaults.go) does.
func setDefaults(obj *kpv1.KubeProxyConfiguration) {
	if obj.BindAddress == "" {
		obj.BindAddress = "0.0.0.0"
	}
	healthz, metrics := "[::]", "[::1]"
	if ip := netutils.ParseIPSloppy(obj.BindAddress); ip != nil && ip.To4() != nil {
		healthz, metrics = "0.0.0.0", "127.0.0.1"
	}
	if obj.HealthzBindAddress == "" {
		obj.HealthzBindAddress = fmt.Sprintf("%s:%v", healthz, proxyHealthzPort)
	} else {
		obj.HealthzBindAddress = appendPortIfNeeded(obj.HealthzBindAddress, proxyHealthzPort)
	}
	if obj.MetricsBindAddress == "" {
		obj.MetricsBindAddress = fmt.Sprintf("%s:%v", metrics, proxyStatusPort)
	} else {
		obj.MetricsBindAddress = appendPortIfNeeded(obj.MetricsBindAddress, proxyStatusPort)
	}
	if obj.OOMScoreAdj == nil {
		obj.OOMScoreAdj = ptr.To[int32](kubeProxyOOMScoreAdj)
	}
	defaultDuration(&obj.IPTables.SyncPeriod, 30*time.Second)
	defaultDuration(&obj.IPTables.MinSyncPeriod, time.Second)
	if obj.IPTables.LocalhostNodePorts == nil {
		obj.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	defaultDuration(&obj.IPVS.SyncPeriod, 30*time.Second)
	defaultDuration(&obj.NFTables.SyncPeriod, 30*time.Second)
	defaultDuration(&obj.NFTables.MinSyncPeriod, time.Second)
	if obj.Conntrack.MaxPerCore == nil {
		obj.Conntrack.MaxPerCore = ptr.To[int32](32 * 1024)
	}
	if obj.Conntrack.Min == nil {
		obj.Conntrack.Min = ptr.To[int32](128 * 1024)
	}
	if obj.IPTables.MasqueradeBit == nil {
		obj.IPTables.MasqueradeBit = ptr.To[int32](14)
	}
	if obj.NFTables.MasqueradeBit == nil {
		obj.NFTables.MasqueradeBit = ptr.To[int32](14)
	}
	if obj.Conntrack.TCPEstablishedTimeout == nil {
		obj.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if obj.Conntrack.TCPCloseWaitTimeout == nil {
		obj.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	defaultDuration(&obj.ConfigSyncPeriod, 15*time.Minute)
	if obj.ClientConnection.ContentType == "" {
		obj.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if obj.ClientConnection.QPS == 0 {
		obj.ClientConnection.QPS = 5
	}
	if obj.ClientConnection.Burst == 0 {
		obj.ClientConnection.Burst = 10
	}
	if obj.FeatureGates == nil {
		obj.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&obj.Logging)
}

func defaultDuration(d *metav1.Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

// appendPortIfNeeded appends port to addr when addr is a bare IP, as
// kube-proxy's proxyutil.AppendPortIfNeeded.
func appendPortIfNeeded(addr string, port int32) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	ip := netutils.ParseIPSloppy(addr)
	if ip == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// internalize converts a v1alpha1 configuration to the internal shape, as
// kube-proxy's Convert_v1alpha1_KubeProxyConfiguration_To_config does:
// the sync periods and masqueradeAll come from the mode's section
// (iptables' for any mode but ipvs and nftables, ebpf included).
func internalize(in *kpv1.KubeProxyConfiguration) proxyConfig {
	c := proxyConfig{KubeProxyConfiguration: *in.DeepCopy()}
	switch string(in.Mode) {
	case modeNFTables:
		c.MasqueradeAll = in.NFTables.MasqueradeAll
	default:
		c.MasqueradeAll = in.IPTables.MasqueradeAll
	}
	switch string(in.Mode) {
	case modeIPVS:
		c.SyncPeriod, c.MinSyncPeriod = in.IPVS.SyncPeriod, in.IPVS.MinSyncPeriod
	case modeNFTables:
		c.SyncPeriod, c.MinSyncPeriod = in.NFTables.SyncPeriod, in.NFTables.MinSyncPeriod
	default:
		c.SyncPeriod, c.MinSyncPeriod = in.IPTables.SyncPeriod, in.IPTables.MinSyncPeriod
	}
	if in.ClusterCIDR != "" {
		c.ClusterCIDRs = strings.Split(in.ClusterCIDR, ",")
	}
	c.ClusterCIDR = ""
	c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod, c.IPTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod = metav1.Duration{}, metav1.Duration{}
	c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod, c.NFTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	// kube-proxy's internal configuration has no portRange: conversion
	// drops it.
	c.PortRange = ""
	return c
}

// external converts back to v1alpha1 as kube-proxy's
// Convert_config_KubeProxyConfiguration_To_v1alpha1 does: the sync
// periods and masqueradeAll go into the mode's section only (the others
// read 0s and false), clusterCIDR is joined again.
func (c *proxyConfig) external() *kpv1.KubeProxyConfiguration {
	out := c.KubeProxyConfiguration.DeepCopy()
	out.APIVersion = kpv1.SchemeGroupVersion.String()
	out.Kind = "KubeProxyConfiguration"
	switch string(c.Mode) {
	case modeNFTables:
		out.NFTables.MasqueradeAll = c.MasqueradeAll
	default:
		out.IPTables.MasqueradeAll = c.MasqueradeAll
	}
	switch string(c.Mode) {
	case modeIPVS:
		out.IPVS.SyncPeriod, out.IPVS.MinSyncPeriod = c.SyncPeriod, c.MinSyncPeriod
	case modeNFTables:
		out.NFTables.SyncPeriod, out.NFTables.MinSyncPeriod = c.SyncPeriod, c.MinSyncPeriod
	default:
		out.IPTables.SyncPeriod, out.IPTables.MinSyncPeriod = c.SyncPeriod, c.MinSyncPeriod
	}
	if len(c.ClusterCIDRs) > 0 {
		out.ClusterCIDR = strings.Join(c.ClusterCIDRs, ",")
	}
	return out
}

// defaultConfig is the configuration before flags: v1alpha1's defaults
// converted with an empty mode, as kube-proxy's newKubeProxyConfiguration.
func defaultConfig() proxyConfig {
	var v kpv1.KubeProxyConfiguration
	setDefaults(&v)
	return internalize(&v)
}

// loadConfigFile reads and decodes a KubeProxyConfiguration file (see
// [decodeConfig]).
func loadConfigFile(path string, log *slog.Logger) (proxyConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return proxyConfig{}, fmt.Errorf("failed to read config file %q: %w", path, err)
	}
	return decodeConfig(data, log)
}

// decodeConfig decodes a KubeProxyConfiguration as kube-proxy's
// loadConfig does: strictly, and when that fails on an unknown or
// duplicate field, leniently with a warning (kube-proxy logs it at info;
// we warn). Other errors (YAML syntax, another kind or version) fail.
// The result has kube-proxy's defaults applied.
func decodeConfig(data []byte, log *slog.Logger) (proxyConfig, error) {
	obj, gvk, err := strictCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		if !runtime.IsStrictDecodingError(err) {
			return proxyConfig{}, fmt.Errorf("failed to decode: %w", err)
		}
		var lerr error
		obj, gvk, lerr = lenientCodecs.UniversalDeserializer().Decode(data, nil, nil)
		if lerr != nil {
			return proxyConfig{}, fmt.Errorf("failed lenient decoding: %w", err)
		}
		log.Warn("Using lenient decoding as strict decoding failed", "err", err)
	}
	v, ok := obj.(*kpv1.KubeProxyConfiguration)
	if !ok {
		return proxyConfig{}, fmt.Errorf("got unexpected config type: %v", gvk)
	}
	setDefaults(v)
	return internalize(v), nil
}

// applyPlatformDefaults sets what kube-proxy's Linux platformApplyDefaults
// sets after the file or the flags: an empty mode is iptables, nftables
// opens node ports on the primary addresses unless told otherwise, and
// local traffic is detected by cluster CIDR.
func (c *proxyConfig) applyPlatformDefaults(log *slog.Logger) {
	if c.Mode == "" {
		log.Info("Using iptables proxy")
		c.Mode = modeIPTables
	}
	if c.Mode == modeNFTables && len(c.NodePortAddresses) == 0 {
		c.NodePortAddresses = []string{nodePortAddressesPrimary}
	}
	if c.DetectLocalMode == "" {
		log.Debug("Defaulting detect-local-mode", "localModeClusterCIDR", localClusterCIDR)
		c.DetectLocalMode = localClusterCIDR
	}
}

// validate checks c as kube-proxy's validation.Validate does (Linux),
// with its field paths (Go field names) and wording; the mode may also be
// ebpf. The error aggregates every problem found.
func (c *proxyConfig) validate() error {
	var errs field.ErrorList
	root := field.NewPath("KubeProxyConfiguration")

	if _, err := resolveGates(c.FeatureGates, slog.New(slog.DiscardHandler)); err != nil {
		errs = append(errs, field.Invalid(root.Child("featureGates"), c.FeatureGates, err.Error()))
	}
	errs = append(errs, validateMasqueradeBit(c.IPTables.MasqueradeBit, root.Child("KubeProxyIPTablesConfiguration", "MasqueradeBit"))...)
	switch c.Mode {
	case modeIPVS:
		p := root.Child("KubeProxyIPVSConfiguration")
		errs = append(errs, nonNegative(c.IPVS.TCPTimeout, p.Child("TCPTimeout"))...)
		errs = append(errs, nonNegative(c.IPVS.TCPFinTimeout, p.Child("TCPFinTimeout"))...)
		errs = append(errs, nonNegative(c.IPVS.UDPTimeout, p.Child("UDPTimeout"))...)
		for i, s := range c.IPVS.ExcludeCIDRs {
			if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
				errs = append(errs, field.Invalid(p.Child("ExcludeCidrs").Index(i), s, "must be a valid CIDR"))
			}
		}
	case modeNFTables:
		errs = append(errs, validateMasqueradeBit(c.NFTables.MasqueradeBit, root.Child("KubeProxyNFTablesConfiguration", "MasqueradeBit"))...)
	}

	linux := root.Child("KubeProxyLinuxConfiguration")
	ct := linux.Child("KubeProxyConntrackConfiguration")
	if c.Conntrack.MaxPerCore != nil && *c.Conntrack.MaxPerCore < 0 {
		errs = append(errs, field.Invalid(ct.Child("MaxPerCore"), c.Conntrack.MaxPerCore, "must be greater than or equal to 0"))
	}
	if c.Conntrack.Min != nil && *c.Conntrack.Min < 0 {
		errs = append(errs, field.Invalid(ct.Child("Min"), c.Conntrack.Min, "must be greater than or equal to 0"))
	}
	if d := c.Conntrack.TCPEstablishedTimeout; d != nil {
		errs = append(errs, nonNegative(*d, ct.Child("TCPEstablishedTimeout"))...)
	}
	if d := c.Conntrack.TCPCloseWaitTimeout; d != nil {
		errs = append(errs, nonNegative(*d, ct.Child("TCPCloseWaitTimeout"))...)
	}
	errs = append(errs, nonNegative(c.Conntrack.UDPTimeout, ct.Child("UDPTimeout"))...)
	errs = append(errs, nonNegative(c.Conntrack.UDPStreamTimeout, ct.Child("UDPStreamTimeout"))...)
	if c.OOMScoreAdj != nil && (*c.OOMScoreAdj < -1000 || *c.OOMScoreAdj > 1000) {
		errs = append(errs, field.Invalid(linux.Child("OOMScoreAdj"), *c.OOMScoreAdj, "must be within the range [-1000, 1000]"))
	}

	switch c.Mode {
	case "", modeIPTables, modeIPVS, modeNFTables, modeEBPF:
	default:
		errs = append(errs, field.Invalid(root.Child("Mode", "ProxyMode"), string(c.Mode),
			"must be ebpf, iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])"))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(root.Child("ClientConnection", "Burst"), int64(c.ClientConnection.Burst), "must be greater than or equal to 0"))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(root.Child("ConfigSyncPeriod"), c.ConfigSyncPeriod, "must be greater than 0"))
	}
	if c.SyncPeriod.Duration <= 0 {
		errs = append(errs, field.Invalid(root.Child("SyncPeriod"), c.SyncPeriod, "must be greater than 0"))
	}
	if c.MinSyncPeriod.Duration < 0 {
		errs = append(errs, field.Invalid(root.Child("MinSyncPeriod"), c.MinSyncPeriod, "must be greater than or equal to 0"))
	}
	if c.MinSyncPeriod.Duration > c.SyncPeriod.Duration {
		errs = append(errs, field.Invalid(root.Child("SyncPeriod"), c.MinSyncPeriod, fmt.Sprintf("must be greater than or equal to %s", root.Child("MinSyncPeriod").String())))
	}
	if netutils.ParseIPSloppy(c.BindAddress) == nil {
		errs = append(errs, field.Invalid(root.Child("BindAddress"), c.BindAddress, "not a valid textual representation of an IP address"))
	}
	if c.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(c.HealthzBindAddress, root.Child("HealthzBindAddress"))...)
	}
	errs = append(errs, validateHostPort(c.MetricsBindAddress, root.Child("MetricsBindAddress"))...)
	for i, a := range c.NodePortAddresses {
		p := root.Child("NodePortAddresses").Index(i)
		if a == nodePortAddressesPrimary {
			if i != 0 || len(c.NodePortAddresses) != 1 {
				errs = append(errs, field.Invalid(p, a, "can't use both 'primary' and CIDRs"))
			}
			break
		}
		if _, _, err := netutils.ParseCIDRSloppy(a); err != nil {
			errs = append(errs, field.Invalid(p, a, "must be a valid CIDR"))
		}
	}
	if v := c.ShowHiddenMetricsForVersion; v != "" {
		if err := validateShowHiddenMetricsVersion(v); err != nil {
			errs = append(errs, field.Invalid(root.Child("ShowHiddenMetricsForVersion"), v, err.Error()))
		}
	}

	modes := []string{localClusterCIDR, localNodeCIDR, localBridgeInterface, localInterfaceNamePrefix, ""}
	if !slices.Contains(modes, string(c.DetectLocalMode)) {
		errs = append(errs, field.NotSupported(root.Child("DetectLocalMode"), string(c.DetectLocalMode), modes))
	}
	dl := root.Child("DetectLocalConfiguration")
	switch c.DetectLocalMode {
	case localBridgeInterface:
		if c.DetectLocal.BridgeInterface == "" {
			errs = append(errs, field.Invalid(dl.Child("InterfaceName"), "", "must not be empty"))
		}
	case localInterfaceNamePrefix:
		if c.DetectLocal.InterfaceNamePrefix == "" {
			errs = append(errs, field.Invalid(dl.Child("InterfacePrefix"), "", "must not be empty"))
		}
	case localClusterCIDR:
		if len(c.ClusterCIDRs) > 0 {
			errs = append(errs, validateDualStackCIDRs(c.ClusterCIDRs, dl.Child("ClusterCIDRs"))...)
		}
	}
	errs = append(errs, validateLogging(&c.Logging, root.Child("logging"))...)
	return errs.ToAggregate()
}

func validateMasqueradeBit(bit *int32, p *field.Path) field.ErrorList {
	if bit != nil && (*bit < 0 || *bit > 31) {
		return field.ErrorList{field.Invalid(p, bit, "must be within the range [0, 31]")}
	}
	return nil
}

func nonNegative(d metav1.Duration, p *field.Path) field.ErrorList {
	if d.Duration < 0 {
		return field.ErrorList{field.Invalid(p, d, "must be greater than or equal to 0")}
	}
	return nil
}

func validateHostPort(input string, p *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(input)
	if err != nil {
		return field.ErrorList{field.Invalid(p, input, "must be IP:port")}
	}
	var errs field.ErrorList
	if netutils.ParseIPSloppy(host) == nil {
		errs = append(errs, field.Invalid(p, host, "must be a valid IP"))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		errs = append(errs, field.Invalid(p, port, "must be a valid port"))
	}
	return errs
}

func validateDualStackCIDRs(cidrs []string, p *field.Path) field.ErrorList {
	const pair = "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"
	switch {
	case len(cidrs) == 0:
		return field.ErrorList{field.Invalid(p, cidrs, "must contain at least one CIDR")}
	case len(cidrs) > 2:
		return field.ErrorList{field.Invalid(p, cidrs, pair)}
	}
	var errs field.ErrorList
	for i, s := range cidrs {
		if _, _, err := netutils.ParseCIDRSloppy(s); err != nil {
			errs = append(errs, field.Invalid(p.Index(i), s, "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"))
		}
	}
	if len(cidrs) == 2 {
		if dual, err := netutils.IsDualStackCIDRStrings(cidrs); err == nil && !dual {
			errs = append(errs, field.Invalid(p, cidrs, pair))
		}
	}
	return errs
}

// validateShowHiddenMetricsVersion accepts the previous minor version
// only, as component-base's metrics.ValidateShowHiddenMetricsVersion.
func validateShowHiddenMetricsVersion(v string) error {
	major, minor, _ := strings.Cut(emulatedMinor, ".")
	m, _ := strconv.Atoi(minor)
	prev := fmt.Sprintf("%s.%d", major, m-1)
	if v != prev {
		return fmt.Errorf("--show-hidden-metrics-for-version must be omitted or have the value '%v'. Only the previous minor version is allowed", prev)
	}
	return nil
}

// validateLogging checks what component-base's logsapi.Validate checks,
// with the text and json formats registered (as in kube-proxy).
func validateLogging(c *logsapi.LoggingConfiguration, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.FlushFrequency.Duration.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("flushFrequency"), c.FlushFrequency, "Must be greater than zero"))
	}
	if c.Format != "text" && c.Format != "json" {
		errs = append(errs, field.Invalid(p.Child("format"), c.Format, "Unsupported log format"))
	}
	if c.Verbosity > math.MaxInt32 {
		errs = append(errs, field.Invalid(p.Child("verbosity"), c.Verbosity, fmt.Sprintf("Must be <= %d", math.MaxInt32)))
	}
	return errs
}

// unsupported reports, naming the field, a setting this daemon cannot
// honour where kube-proxy would: a detect-local mode no backend has,
// ipvs.excludeCIDRs, logging options slog does not have. A setting that
// kube-proxy itself ignores on Linux (winkernel, windowsRunAsService,
// portRange) is logged instead, at warning.
func (c *proxyConfig) unsupported(log *slog.Logger) error {
	switch c.DetectLocalMode {
	case localBridgeInterface, localInterfaceNamePrefix:
		return fmt.Errorf("detectLocalMode %s: not supported: the proxykit backends detect local traffic by source CIDR only (ClusterCIDR, NodeCIDR)", c.DetectLocalMode)
	}
	if c.Mode == modeIPVS && len(c.IPVS.ExcludeCIDRs) > 0 {
		return fmt.Errorf("ipvs.excludeCIDRs %v (--ipvs-exclude-cidrs): not supported: the ipvs backend removes only the virtual servers it recorded as its own or that sit on its dummy interface's addresses, so there is nothing to exclude", c.IPVS.ExcludeCIDRs)
	}
	if len(c.Logging.VModule) > 0 {
		return fmt.Errorf("logging.vmodule (--vmodule): not supported: log/slog has one level")
	}
	for name, o := range map[string]logsapi.OutputRoutingOptions{"text": c.Logging.Options.Text.OutputRoutingOptions, "json": c.Logging.Options.JSON.OutputRoutingOptions} {
		if o.SplitStream {
			return fmt.Errorf("logging.options.%s.splitStream (--log-%s-split-stream): not supported", name, name)
		}
		if !o.InfoBufferSize.IsZero() {
			return fmt.Errorf("logging.options.%s.infoBufferSize (--log-%s-info-buffer-size): not supported", name, name)
		}
	}
	if c.Winkernel != (kpv1.KubeProxyWinkernelConfiguration{}) || c.WindowsRunAsService {
		log.Warn("ignoring the Windows settings (winkernel, windowsRunAsService), as kube-proxy does on Linux")
	}
	return nil
}

// writeConfig writes c as kube-proxy's --write-config-to does: YAML of
// the v1alpha1 object, keys sorted.
func writeConfig(path string, c *proxyConfig) error {
	b, err := yaml.Marshal(c.external())
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// configzJSON is the body of /configz: {"kubeproxy.config.k8s.io": the
// v1alpha1 configuration}, as component-base's configz serves it.
func configzJSON(c *proxyConfig) ([]byte, error) {
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(map[string]any{kpv1.GroupName: c.external()})
	return bytes.TrimRight(buf.Bytes(), "\n"), err
}
