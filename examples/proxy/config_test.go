package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

// syncBuffer is a log destination tests read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// resolveArgs resolves args and returns the settings and the log.
func resolveArgs(t *testing.T, args ...string) (*settings, string, error) {
	t.Helper()
	var log syncBuffer
	s, err := resolve(args, &log)
	return s, log.String(), err
}

// writeOut resolves args plus --write-config-to and returns the file.
func writeOut(t *testing.T, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.yaml")
	s, log, err := resolveArgs(t, append(args, "--write-config-to", out)...)
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, log)
	}
	if err := writeConfig(out, &s.cfg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWriteConfigMatchesKubeProxy checks --write-config-to against files
// the real kube-proxy v1.36.3 wrote (testdata): its defaults with no
// flags, and a file (an unknown field, nftables, flags that the file
// overrides) read with --config.
func TestWriteConfigMatchesKubeProxy(t *testing.T) {
	if got, want := writeOut(t), readFile(t, "testdata/kube-proxy-default.yaml"); got != want {
		t.Errorf("defaults differ from kube-proxy's:\n%s\nwant:\n%s", got, want)
	}
	got := writeOut(t, "--config", "testdata/f1.yaml", "--proxy-mode=ipvs", "--masquerade-all")
	if want := readFile(t, "testdata/kube-proxy-f1.yaml"); got != want {
		t.Errorf("--config testdata/f1.yaml differs from kube-proxy's:\n%s\nwant:\n%s", got, want)
	}
}

// TestDecodeDefaults checks kube-proxy's defaults and platform defaults
// on a file that sets nothing but the kind.
func TestDecodeDefaults(t *testing.T) {
	f := writeConfigFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n")
	s, _, err := resolveArgs(t, "--config", f)
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Mode != modeIPTables || c.DetectLocalMode != localClusterCIDR || len(c.NodePortAddresses) != 0 {
		t.Errorf("mode %q detectLocalMode %q nodePortAddresses %v", c.Mode, c.DetectLocalMode, c.NodePortAddresses)
	}
	if *c.IPTables.MasqueradeBit != 14 || *c.NFTables.MasqueradeBit != 14 || !*c.IPTables.LocalhostNodePorts {
		t.Errorf("iptables %+v nftables %+v", c.IPTables, c.NFTables)
	}
	if c.SyncPeriod.Duration != 30*time.Second || c.MinSyncPeriod.Duration != time.Second || c.ConfigSyncPeriod.Duration != 15*time.Minute {
		t.Errorf("sync %v min %v config %v", c.SyncPeriod, c.MinSyncPeriod, c.ConfigSyncPeriod)
	}
	if c.HealthzBindAddress != "0.0.0.0:10256" || c.MetricsBindAddress != "127.0.0.1:10249" || *c.OOMScoreAdj != -999 {
		t.Errorf("healthz %q metrics %q oom %d", c.HealthzBindAddress, c.MetricsBindAddress, *c.OOMScoreAdj)
	}
	if *c.Conntrack.MaxPerCore != 32768 || *c.Conntrack.Min != 131072 || c.Conntrack.TCPEstablishedTimeout.Duration != 24*time.Hour {
		t.Errorf("conntrack %+v", c.Conntrack)
	}

	// nftables opens node ports on the primary addresses by default.
	f = writeConfigFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n")
	if s, _, err = resolveArgs(t, "--config", f); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.cfg.NodePortAddresses, []string{"primary"}) {
		t.Errorf("nftables nodePortAddresses %v", s.cfg.NodePortAddresses)
	}
}

// TestDecodeLenient checks that an unknown field is a warning, as in
// kube-proxy, and that the rest of the file applies.
func TestDecodeLenient(t *testing.T) {
	f := writeConfigFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nbogusField: 1\n")
	s, log, err := resolveArgs(t, "--config", f)
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Mode != modeIPVS {
		t.Errorf("mode %q", s.cfg.Mode)
	}
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "lenient decoding") || !strings.Contains(log, `unknown field \"bogusField\"`) {
		t.Errorf("no warning naming the field:\n%s", log)
	}
}

// TestDecodeErrors checks that bad files and values fail naming what is
// wrong, in kube-proxy's words.
func TestDecodeErrors(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct{ file, want string }{
		{head + "iptables:\n  masqueradeBit: 40\n", "KubeProxyConfiguration.KubeProxyIPTablesConfiguration.MasqueradeBit: Invalid value: 40: must be within the range [0, 31]"},
		{head + "mode: nftables\nnftables:\n  masqueradeBit: -1\n", "KubeProxyNFTablesConfiguration.MasqueradeBit: Invalid value: -1"},
		{head + "mode: userspace\n", `KubeProxyConfiguration.Mode.ProxyMode: Invalid value: "userspace": must be ebpf, iptables, ipvs, nftables or blank`},
		{head + "conntrack:\n  min: -5\n", "KubeProxyConntrackConfiguration.Min: Invalid value: -5"},
		{head + "nodePortAddresses: [10.0.0.0/33]\n", `KubeProxyConfiguration.NodePortAddresses[0]: Invalid value: "10.0.0.0/33": must be a valid CIDR`},
		{head + "nodePortAddresses: [primary, 10.0.0.0/8]\n", "can't use both 'primary' and CIDRs"},
		{head + "metricsBindAddress: nonsense\n", `KubeProxyConfiguration.MetricsBindAddress: Invalid value: "nonsense": must be IP:port`},
		{head + "clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", "DetectLocalConfiguration.ClusterCIDRs"},
		{head + "detectLocalMode: Magic\n", `KubeProxyConfiguration.DetectLocalMode: Unsupported value: "Magic"`},
		{head + "iptables:\n  minSyncPeriod: 1m\n", "must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod"},
		{head + "oomScoreAdj: 2000\n", "KubeProxyLinuxConfiguration.OOMScoreAdj: Invalid value: 2000"},
		{head + "featureGates:\n  Bogus: true\n", "unrecognized feature gate: Bogus"},
		{head + "logging:\n  format: xml\n", `logging.format: Invalid value: "xml": Unsupported log format`},
		{"apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n", "failed to decode"},
		{head + "mode: [\n", "failed to decode"},
	} {
		_, log, err := resolveArgs(t, "--config", writeConfigFile(t, tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q\n%s", tc.file, err, tc.want, log)
		}
	}
	// The same through a flag.
	if _, _, err := resolveArgs(t, "--iptables-masquerade-bit=40"); err == nil || !strings.Contains(err.Error(), "MasqueradeBit: Invalid value: 40") {
		t.Errorf("--iptables-masquerade-bit=40: %v", err)
	}
}

// TestUnsupported checks that what no backend implements fails, naming
// the setting, instead of being ignored.
func TestUnsupported(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"}, "detectLocalMode BridgeInterface: not supported"},
		{[]string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"}, "detectLocalMode InterfaceNamePrefix: not supported"},
		{[]string{"--config", writeConfigFile(t, head+"mode: ipvs\nipvs:\n  excludeCIDRs: [10.0.0.0/8]\n")}, "ipvs.excludeCIDRs [10.0.0.0/8] (--ipvs-exclude-cidrs): not supported"},
		{[]string{"--proxy-mode=ipvs", "--ipvs-exclude-cidrs=10.0.0.0/8"}, "ipvs.excludeCIDRs"},
		{[]string{"--vmodule=foo=4"}, "--vmodule: not supported"},
		{[]string{"--log-json-split-stream=true"}, "--log-json-split-stream: not supported"},
		{[]string{"--feature-gates=AllowServiceExternalIPs=false"}, "feature gate AllowServiceExternalIPs=false: not supported"},
		{[]string{"--proxy-mode=nftables", "--scheduler=wrr"}, "--scheduler wrr: the nftables backend picks endpoints at random"},
		{[]string{"--proxy-mode=ipvs", "--ipvs-scheduler=fifo"}, `ipvs.scheduler "fifo": unknown scheduler`},
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
	} {
		if _, log, err := resolveArgs(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q\n%s", tc.args, err, tc.want, log)
		}
	}
}

// TestFlagPrecedence checks kube-proxy's precedence: without --config the
// flags apply (the sync period flags to the mode); with it the file
// wins, each ignored flag is logged at warning and not applied, and -v,
// --hostname-override and proxykit's own flags still apply.
func TestFlagPrecedence(t *testing.T) {
	s, _, err := resolveArgs(t, "--proxy-mode=nftables", "--iptables-sync-period=7s", "--iptables-min-sync-period=2s",
		"--ipvs-sync-period=9s", "--cluster-cidr=10.0.0.0/8", "--masquerade-all", "--iptables-masquerade-bit=5")
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Mode != modeNFTables || c.SyncPeriod.Duration != 7*time.Second || c.MinSyncPeriod.Duration != 2*time.Second ||
		!reflect.DeepEqual(c.ClusterCIDRs, []string{"10.0.0.0/8"}) || !c.MasqueradeAll || *c.IPTables.MasqueradeBit != 5 || *c.NFTables.MasqueradeBit != 14 {
		t.Errorf("flags not applied as kube-proxy applies them: %+v", c)
	}

	f := writeConfigFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nconntrack:\n  min: 7\n")
	s, log, err := resolveArgs(t, "--config", f, "--proxy-mode=ipvs", "--masquerade-all", "--ipvs-scheduler=wrr",
		"--conntrack-min=5", "-v=3", "--hostname-override= MyNode ", "--netns=/var/run/netns/x", "--keep-leftovers")
	if err != nil {
		t.Fatal(err)
	}
	c = s.cfg
	if c.Mode != modeNFTables || c.MasqueradeAll || c.IPVS.Scheduler != "" || *c.Conntrack.Min != 7 {
		t.Errorf("a flag won over the file: mode %q masqueradeAll %v scheduler %q conntrack.min %d", c.Mode, c.MasqueradeAll, c.IPVS.Scheduler, *c.Conntrack.Min)
	}
	if c.Logging.Verbosity != 3 || s.level.Level() != slog.Level(-3) || c.HostnameOverride != "mynode" || s.ext.netns != "/var/run/netns/x" || !s.ext.keepLeftovers {
		t.Errorf("verbosity %d level %v hostname %q netns %q", c.Logging.Verbosity, s.level.Level(), c.HostnameOverride, s.ext.netns)
	}
	for _, flag := range []string{"--proxy-mode", "--masquerade-all", "--ipvs-scheduler", "--conntrack-min"} {
		if !strings.Contains(log, flag) {
			t.Errorf("the ignored flag %s is not reported:\n%s", flag, log)
		}
	}
	if !strings.Contains(log, "level=WARN") || strings.Contains(log, "--hostname-override ") {
		t.Errorf("log:\n%s", log)
	}
	if _, _, err := resolveArgs(t, "--hostname-override=  "); err == nil || !strings.Contains(err.Error(), "empty hostname-override is invalid") {
		t.Errorf("blank --hostname-override: %v", err)
	}
}

// TestWriteConfigRoundTrip checks that a configuration written with
// --write-config-to reads back (--config) to the same resolved
// configuration and writes the same file again, for each mode.
func TestWriteConfigRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--proxy-mode=nftables", "--iptables-min-sync-period=3s", "--masquerade-all", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/48"},
		{"--proxy-mode=ipvs", "--ipvs-scheduler=wrr", "--ipvs-strict-arp", "--ipvs-sync-period=1m", "--ipvs-tcp-timeout=10m", "--nodeport-addresses=10.0.0.0/8"},
		{"--proxy-mode=ebpf", "--iptables-masquerade-bit=3", "--conntrack-max-per-core=0", "--feature-gates=ContextualLogging=false", "--profiling"},
		{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false", "--bind-address=fd00::1", "--detect-local-mode=NodeCIDR", "-v=4"},
	} {
		first := writeOut(t, args...)
		path := writeConfigFile(t, first)
		s1, _, err := resolveArgs(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		s2, _, err := resolveArgs(t, "--config", path)
		if err != nil {
			t.Fatalf("%v: reading back: %v", args, err)
		}
		if !reflect.DeepEqual(s1.cfg.external(), s2.cfg.external()) {
			t.Errorf("%v: read back differs:\n%+v\n%+v", args, s1.cfg.external(), s2.cfg.external())
		}
		if second := writeOut(t, "--config", path); second != first {
			t.Errorf("%v: written again differs:\n%s\n%s", args, first, second)
		}
	}
}

// TestEBPFMode checks proxykit's ebpf mode from a file: the iptables
// section's periods apply (kube-proxy's rule for a mode that is neither
// ipvs nor nftables), the --ebpf-* flags and --scheduler apply with
// --config, and the mode is reported.
func TestEBPFMode(t *testing.T) {
	f := writeConfigFile(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ebpf
clusterCIDR: 10.244.0.0/16
iptables:
  syncPeriod: 45s
  minSyncPeriod: 200ms
nodePortAddresses: [192.0.2.0/24]
`)
	s, _, err := resolveArgs(t, "--config", f, "--ebpf-cgroup=/sys/fs/cgroup/x", "--ebpf-pin-path=/sys/fs/bpf/x", "--scheduler=maglev", "--ebpf-socket-only")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := s.backendConfig(nodeInfo{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EBPF.CgroupPath != "/sys/fs/cgroup/x" || cfg.EBPF.PinPath != "/sys/fs/bpf/x" || cfg.EBPF.Scheduler != proxier.SchedulerMaglev || !cfg.EBPF.SocketOnly {
		t.Errorf("ebpf section %+v", cfg.EBPF)
	}
	if cfg.SyncPeriod != 45*time.Second || cfg.MinSyncInterval != 200*time.Millisecond || cfg.HealthTimeout != 90*time.Second {
		t.Errorf("sync %v min %v health timeout %v", cfg.SyncPeriod, cfg.MinSyncInterval, cfg.HealthTimeout)
	}
	if !reflect.DeepEqual(cfg.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}) ||
		!reflect.DeepEqual(cfg.NodePortAddresses, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) {
		t.Errorf("cluster CIDRs %v node port addresses %v", cfg.ClusterCIDRs, cfg.NodePortAddresses)
	}
}

// TestBackendConfig checks the mapping of kube-proxy's fields to the
// backends' options: masquerade bits per mode, localhost node ports,
// IPVS options, "primary" and NodeCIDR from the Node, --bind-address.
func TestBackendConfig(t *testing.T) {
	s, _, err := resolveArgs(t, "--proxy-mode=ipvs", "--iptables-masquerade-bit=5", "--ipvs-scheduler=sh", "--ipvs-strict-arp",
		"--ipvs-udp-timeout=1m", "--iptables-localhost-nodeports=false", "--nodeport-addresses=primary",
		"--bind-address=192.0.2.9", "--detect-local-mode=NodeCIDR")
	if err != nil {
		t.Fatal(err)
	}
	info := nodeInfo{
		ips:      []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")},
		podCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"},
	}
	cfg, err := s.backendConfig(info, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IPVS.MasqueradeBit != 1<<5 || cfg.IPTables.MasqueradeBit != 1<<5 || cfg.NFTables.MasqueradeBit != 1<<14 {
		t.Errorf("masquerade marks ipvs %#x iptables %#x nftables %#x", cfg.IPVS.MasqueradeBit, cfg.IPTables.MasqueradeBit, cfg.NFTables.MasqueradeBit)
	}
	if cfg.IPVS.Scheduler != proxier.SchedulerSourceHashing || !cfg.IPVS.StrictARP || cfg.IPVS.UDPTimeout != time.Minute || !cfg.IPTables.NoLocalhostNodePorts {
		t.Errorf("ipvs %+v iptables %+v", cfg.IPVS, cfg.IPTables)
	}
	wantNP := []netip.Prefix{netip.MustParsePrefix("192.0.2.9/32"), netip.MustParsePrefix("fd00::5/128")}
	wantCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}
	if !reflect.DeepEqual(cfg.NodePortAddresses, wantNP) || !reflect.DeepEqual(cfg.ClusterCIDRs, wantCIDRs) || !reflect.DeepEqual(cfg.NodeIPs, []netip.Addr{netip.MustParseAddr("192.0.2.9")}) {
		t.Errorf("node port addresses %v cluster CIDRs %v node IPs %v", cfg.NodePortAddresses, cfg.ClusterCIDRs, cfg.NodeIPs)
	}
	// ipvs.minSyncPeriod defaults to 0, kube-proxy's "sync at once".
	f := writeConfigFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n")
	s2, _, err := resolveArgs(t, "--config", f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg2, err := s2.backendConfig(nodeInfo{}, nil); err != nil || cfg2.MinSyncInterval != time.Nanosecond || cfg2.SyncPeriod != 30*time.Second {
		t.Errorf("ipvs periods: %v %v %v", cfg2.MinSyncInterval, cfg2.SyncPeriod, err)
	}
	// The node setup gets the expanded addresses and the mode.
	ns := s.nodeSetupConfig(cfg)
	if ns.Mode != modeIPVS || !ns.IPVSStrictARP || ns.LocalhostNodePorts || !reflect.DeepEqual(ns.NodePortAddresses, []string{"192.0.2.9/32", "fd00::5/128"}) || ns.Conntrack.MaxPerCore != 32768 {
		t.Errorf("node setup %+v", ns)
	}
}

// TestFeatureGates checks --feature-gates as kube-proxy: known gates are
// accepted and reported, unknown or locked ones fail.
func TestFeatureGates(t *testing.T) {
	s, log, err := resolveArgs(t, "--feature-gates=ContextualLogging=false,NFTablesProxyMode=true")
	if err != nil {
		t.Fatal(err)
	}
	if s.gates.enabled["ContextualLogging"] || !strings.Contains(log, "ContextualLogging=false") {
		t.Errorf("gates %v, log:\n%s", s.gates, log)
	}
	if _, _, err := resolveArgs(t, "--feature-gates=Bogus=true"); err == nil || err.Error() != "failed complete: unrecognized feature gate: Bogus" {
		t.Errorf("unknown gate: %v", err)
	}
	if _, _, err := resolveArgs(t, "--feature-gates=MultiCIDRServiceAllocator=false"); err == nil || !strings.Contains(err.Error(), "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true") {
		t.Errorf("locked gate: %v", err)
	}
	if _, _, err := resolveArgs(t, "--feature-gates=ContextualLogging=maybe"); err == nil || !strings.Contains(err.Error(), "invalid value of ContextualLogging=maybe") {
		t.Errorf("bad value: %v", err)
	}
}

// TestMetricsServer checks the metrics server's endpoints: /proxyMode
// and /configz as kube-proxy answers them, the /healthz ping, and the
// profiling endpoints only with --profiling.
func TestMetricsServer(t *testing.T) {
	s, _, err := resolveArgs(t, "--proxy-mode=nftables", "--feature-gates=ContextualLogging=false")
	if err != nil {
		t.Fatal(err)
	}
	configz, err := configzJSON(&s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := metricsHandler(prometheus.NewRegistry(), string(s.cfg.Mode), configz, false, s.level, nil)
	serve := func(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}
	if w := serve(h, "GET", "/proxyMode", ""); w.Code != 200 || w.Body.String() != "nftables" || w.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("/proxyMode: %d %q %v", w.Code, w.Body, w.Header())
	}
	if w := serve(h, "GET", "/healthz", ""); w.Code != 200 || w.Body.String() != "ok" {
		t.Errorf("/healthz: %d %q", w.Code, w.Body)
	}
	w := serve(h, "GET", "/configz", "")
	var got map[string]kpv1.KubeProxyConfiguration
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("/configz: %v %q", err, w.Body)
	}
	c, ok := got["kubeproxy.config.k8s.io"]
	if !ok || c.Kind != "KubeProxyConfiguration" || c.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" || c.Mode != "nftables" ||
		c.NFTables.SyncPeriod.Duration != 30*time.Second || c.IPTables.SyncPeriod.Duration != 0 || c.FeatureGates["ContextualLogging"] {
		t.Errorf("/configz: %s", w.Body)
	}
	if w := serve(h, "GET", "/debug/pprof/", ""); w.Code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --profiling: %d", w.Code)
	}
	h = metricsHandler(prometheus.NewRegistry(), "nftables", configz, true, s.level, nil)
	if w := serve(h, "GET", "/debug/pprof/", ""); w.Code != 200 {
		t.Errorf("/debug/pprof/ with --profiling: %d", w.Code)
	}
	if w := serve(h, "PUT", "/debug/flags/v", "4"); w.Code != 200 || s.level.Level() != slog.LevelDebug {
		t.Errorf("/debug/flags/v: %d %q, level %v", w.Code, w.Body, s.level.Level())
	}
}

// healthProxier is a Proxier with a fixed health.
type healthProxier struct {
	*fakeproxier.Events
	h proxier.Health
}

func (p healthProxier) Health() proxier.Health { return p.h }

// TestHealthzNodeEligibility checks /healthz and /livez as kube-proxy
// answers them: /healthz needs the Node, not being deleted and without
// the autoscaler's taint; /livez does not look at the Node; a pending
// event older than the timeout fails both.
func TestHealthzNodeEligibility(t *testing.T) {
	p := healthProxier{Events: &fakeproxier.Events{}, h: proxier.Health{LastSync: time.Now(), Running: true}}
	nodes := &nodeTracker{Proxier: p, log: slog.New(slog.DiscardHandler)}
	h := healthzHandler(p, nodes, []model.IPFamily{model.IPv4}, time.Minute)
	check := func(path string, wantCode int, wantEligible *bool) {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		var body struct {
			LastUpdated  time.Time `json:"lastUpdated"`
			NodeEligible *bool     `json:"nodeEligible"`
			Healthy      bool      `json:"healthy"`
			Status       map[string]struct {
				Healthy bool `json:"healthy"`
			} `json:"status"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v: %q", path, err, w.Body)
		}
		if w.Code != wantCode || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %v, want %d", path, w.Code, w.Header(), wantCode)
		}
		if (wantEligible == nil) != (body.NodeEligible == nil) || (wantEligible != nil && *wantEligible != *body.NodeEligible) {
			t.Errorf("%s: nodeEligible %v, want %v: %s", path, body.NodeEligible, wantEligible, w.Body)
		}
		if _, ok := body.Status["IPv4"]; !ok {
			t.Errorf("%s: no IPv4 status: %s", path, w.Body)
		}
	}
	yes, no := true, false

	check("/healthz", http.StatusServiceUnavailable, &no) // no Node yet
	check("/livez", http.StatusOK, nil)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}
	nodes.OnNodeAdd(node)
	check("/healthz", http.StatusOK, &yes)

	deleting := node.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	nodes.OnNodeUpdate(node, deleting)
	check("/healthz", http.StatusServiceUnavailable, &no)
	check("/livez", http.StatusOK, nil)

	tainted := node.DeepCopy()
	tainted.Spec.Taints = []v1.Taint{{Key: proxier.TaintToBeDeletedByClusterAutoscaler, Effect: v1.TaintEffectNoSchedule}}
	nodes.OnNodeUpdate(deleting, tainted)
	check("/healthz", http.StatusServiceUnavailable, &no)

	nodes.OnNodeUpdate(tainted, node)
	check("/healthz", http.StatusOK, &yes)
	p.h.OldestPending = time.Now().Add(-2 * time.Minute)
	h = healthzHandler(p, nodes, []model.IPFamily{model.IPv4}, time.Minute)
	check("/healthz", http.StatusServiceUnavailable, &yes)
	check("/livez", http.StatusServiceUnavailable, nil)
}
