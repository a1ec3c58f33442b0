package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/proxykit/proxykit/internal/testnet"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/sandbox"
)

var clusterIP = netip.MustParseAddr("10.96.0.10")

const nodePort = 30080

func webService() *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeNodePort, ClusterIP: clusterIP.String(), ClusterIPs: []string{clusterIP.String()},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080), NodePort: nodePort}},
		},
	}
}

func webSlice(pods ...*sandbox.Pod) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IPv4.String()},
			NodeName: ptr.To(p.Node.Name), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// answeredBy probes dst from h until eight requests in a row are
// answered by exactly the pods want (each seen, no other), within 10 s,
// and fails the test otherwise.
func answeredBy(t *testing.T, h *sandbox.Host, dst netip.AddrPort, want ...string) {
	t.Helper()
	var last sandbox.Result
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got, all := map[string]bool{}, true
		for range 8 {
			if last = h.TCP(dst, time.Second); last.Outcome != sandbox.Answered || !slices.Contains(want, last.Server) {
				all = false
				break
			}
			got[last.Server] = true
		}
		if all && len(got) == len(want) {
			return
		}
	}
	t.Fatalf("%s → %s: last %v; want answers from %v", h.Name, dst, last, want)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProxy runs the daemon against a fake API server (client-go's fake
// clientset behind real informers) with a backend programming node1 of a
// sandbox, and checks that Services and EndpointSlices created, changed
// through the API reach the kernel: traffic to the cluster IP and the
// node port lands on the right pods. It checks /healthz, /livez and
// /metrics, that stopping the daemon leaves the dataplane in place, and
// that --cleanup removes it. It runs the nftables backend, and the eBPF
// one with its own options (a cgroup of the test's own, a pin path).
func TestProxy(t *testing.T) {
	sandbox.RequirePrivilege(t)
	// ipvs needs a kernel with IPVS: on a host without, it skips (the
	// CI runs it in hack/vmtest.sh's VM).
	for _, backend := range []string{"nftables", "ebpf", "ipvs"} {
		t.Run(backend, func(t *testing.T) { testProxy(t, backend) })
	}
}

func testProxy(t *testing.T, backend string) {
	if backend == "ipvs" {
		requireIPVS(t)
	}
	tp, err := sandbox.New(t.Context(), sandbox.Options{Node1Pods: 1, Node2Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Error(err)
		}
	})
	p1, p2 := tp.Node1.Pods[0], tp.Node2.Pods[0]
	// The Node lists node1's addresses toward the client: nftables'
	// default nodePortAddresses "primary" opens node ports there.
	client := fake.NewClientset(&v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: tp.Node1.Name},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: tp.Node1.ExternalIPv4.String()},
			{Type: v1.NodeInternalIP, Address: tp.Node1.ExternalIPv6.String()},
		}},
	})
	var cidrs []string
	for _, p := range tp.PodNetworks() {
		cidrs = append(cidrs, p.String())
	}
	// conntrack.maxPerCore 0: nf_conntrack_max and the hash size are the
	// host's; the timeouts are set in node1's namespace.
	file := writeConfigFile(t, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
nftables:
  minSyncPeriod: 50ms
iptables:
  minSyncPeriod: 50ms
ipvs:
  minSyncPeriod: 50ms
`, backend, strings.Join(cidrs, ","), freePort(t), freePort(t)))
	args := []string{"--config", file, "--hostname-override", tp.Node1.Name, "--netns", tp.Node1.NetNSPath()}
	if backend == "ebpf" {
		// The probes are this process's goroutines: the socket
		// programs attach to a cgroup the process moves into, and
		// translate node1's sockets; the client outside takes the
		// north-south table. Pinned, the programs outlive the daemon.
		cg, err := sandbox.EnterCgroup("proxykit-proxy-test-")
		if err != nil {
			t.Skipf("needs cgroup v2: %v", err)
		}
		t.Cleanup(func() {
			if err := cg.Leave(); err != nil {
				t.Error(err)
			}
		})
		args = append(args, "--ebpf-cgroup", cg.Path(), "--ebpf-pin-path", bpffs(t), "--scheduler", "maglev")
	}
	s, err := resolve(args, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{s: s, client: client, nodeName: tp.Node1.Name, ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	select {
	case <-d.ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	// kube-proxy's birth cry, about node1, written through events.k8s.io/v1.
	var starting *eventsv1.Event
	for deadline := time.Now().Add(5 * time.Second); starting == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		starting = findEvent(listEvents(t, client), "Starting")
	}
	checkNodeEvent(t, starting, tp.Node1.Name, v1.EventTypeNormal, "Starting", "")

	if _, err := client.CoreV1().Services("demo").Create(ctx, webService(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("demo").Create(ctx, webSlice(p1, p2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(clusterIP, 80)
	np := netip.AddrPortFrom(tp.Node1.ExternalIPv4, nodePort)
	answeredBy(t, &tp.Node1.Host, vip, p1.Name, p2.Name)
	answeredBy(t, tp.Client, np, p1.Name, p2.Name)

	// An update through the API is programmed too.
	if _, err := client.DiscoveryV1().EndpointSlices("demo").Update(ctx, webSlice(p2), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	answeredBy(t, &tp.Node1.Host, vip, p2.Name)

	checkDebugServices(t, backend, "http://"+d.metricsAddr.String(), p2.IPv4.String()+":8080")

	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(t, "http://"+d.healthzAddr.String()+path)
		if code != http.StatusOK || !strings.Contains(body, "lastUpdated") {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	if code, body := get(t, "http://"+d.metricsAddr.String()+"/proxyMode"); code != http.StatusOK || body != backend {
		t.Errorf("/proxyMode: %d %q", code, body)
	}
	// node1's namespace got the conntrack timeouts of the configuration.
	if out, err := tp.Node1.Exec(ctx, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"); err != nil || strings.TrimSpace(out) != "86400" {
		t.Errorf("nf_conntrack_tcp_timeout_established in node1: %q %v", out, err)
	}
	_, metrics := get(t, "http://"+d.metricsAddr.String()+"/metrics")
	for _, m := range []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_endpoint_changes_total", "go_goroutines"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return")
	}
	// A stopped proxy leaves the dataplane for its successor, and
	// inspect --kernel reads it without the proxy.
	answeredBy(t, &tp.Node1.Host, vip, p2.Name)
	var out strings.Builder
	if err := command(t.Context(), append([]string{"inspect", "--kernel"}, args...), &out, testLog{t}, nil); err != nil {
		t.Fatalf("inspect --kernel: %v", err)
	}
	if want := "10.96.0.10 tcp/80 -> " + p2.IPv4.String() + ":8080"; !strings.Contains(out.String(), want) {
		t.Errorf("inspect --kernel lacks %q:\n%s", want, out.String())
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if err := backends.CleanupAll(cctx, s.cleanupConfig(), ""); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if r := tp.Node1.TCP(vip, 500*time.Millisecond); r.Outcome == sandbox.Answered {
		t.Errorf("after --cleanup the service still answers: %v", r)
	}
	if pin := s.ext.ebpfPinPath; pin != "" {
		if es, err := os.ReadDir(pin); err != nil || len(es) > 2 { // maps.debug, progs.debug
			t.Errorf("after --cleanup the pin path holds %v (%v)", es, err)
		}
	}
}

// checkDebugServices checks /debug/services of the metrics server at
// base, and the inspect subcommand asking it: the web service's cluster
// IP reaches ep alone, read back from the kernel without differences.
func checkDebugServices(t *testing.T, backend, base, ep string) {
	t.Helper()
	code, text := get(t, base+"/debug/services")
	want := "ClusterIP    10.96.0.10 tcp/80 -> " + ep
	if code != http.StatusOK || !strings.Contains(text, "demo/web:http/TCP") || !strings.Contains(text, want) || strings.Contains(text, "DIFFERS") {
		t.Errorf("/debug/services: %d, want %q and no difference:\n%s", code, want, text)
	}
	code, body := get(t, base+"/debug/services?format=json")
	var r proxier.Report
	if err := json.Unmarshal([]byte(body), &r); code != http.StatusOK || err != nil || r.Backend != backend || len(r.Families) != 2 {
		t.Fatalf("/debug/services?format=json: %d %v %+v", code, err, r)
	}
	for _, fr := range r.Families {
		if fr.Error != "" {
			t.Errorf("%s: %s", fr.Family, fr.Error)
		}
		for _, sr := range fr.Services {
			for _, f := range sr.Frontends {
				if !f.Read || f.Diff != "" {
					t.Errorf("%s %s %s: read %t, diff %q", fr.Family, sr.Service, f.Kind, f.Read, f.Diff)
				}
			}
		}
	}
	var out strings.Builder
	if err := command(t.Context(), []string{"inspect", "--server", base}, &out, testLog{t}, nil); err != nil || out.String() != text {
		t.Errorf("inspect --server: %v\n%s\nwant\n%s", err, out.String(), text)
	}
	code, plan := get(t, base+"/debug/services?plan=true")
	if code != http.StatusOK || !strings.Contains(plan, want) {
		t.Errorf("/debug/services?plan=true: %d\n%s", code, plan)
	}
}

// TestDryRun checks that --dry-run prints the node settings and what the
// backend would program for the objects of the API server, and changes
// neither: no table, no sysctl.
func TestDryRun(t *testing.T) {
	sandbox.RequirePrivilege(t)
	tp, err := sandbox.New(t.Context(), sandbox.Options{Node1Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Error(err)
		}
	})
	p1 := tp.Node1.Pods[0]
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: tp.Node1.Name}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: tp.Node1.ExternalIPv4.String()},
	}}}
	client := fake.NewClientset(node, webService(), webSlice(p1))
	file := writeConfigFile(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
`)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	before, err := tp.Node1.Exec(ctx, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = command(ctx, []string{"--dry-run", "--config", file, "--hostname-override", tp.Node1.Name, "--netns", tp.Node1.NetNSPath()},
		&out, testLog{t}, func(*settings) (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"net/netfilter/nf_conntrack_tcp_timeout_established: " + strings.TrimSpace(before) + " -> 7200",
		"backend nftables",
		"demo/web:http/TCP  internal=Cluster external=Cluster",
		"ClusterIP    10.96.0.10 tcp/80 -> " + p1.IPv4.String() + ":8080",
		"NodePort     node-ports tcp/30080 -> " + p1.IPv4.String() + ":8080",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--dry-run output lacks %q:\n%s", want, out.String())
		}
	}
	after, err := tp.Node1.Exec(ctx, "cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
	if err != nil || after != before {
		t.Errorf("--dry-run changed nf_conntrack_tcp_timeout_established: %q -> %q (%v)", before, after, err)
	}
	if rules, err := tp.Node1.Exec(ctx, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(rules) != "" {
		t.Errorf("--dry-run programmed node1 (%v):\n%s", err, rules)
	}
}

// requireIPVS skips the test on a kernel without IPVS, unless
// PROXYKIT_REQUIRE_IPVS=1 (set by hack/vmtest.sh's VM, whose kernel has
// it) makes that a failure.
func requireIPVS(t *testing.T) {
	t.Helper()
	_ = exec.Command("modprobe", "ip_vs").Run()
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		if os.Getenv("PROXYKIT_REQUIRE_IPVS") == "1" {
			t.Fatalf("this kernel has no IPVS (%v), and PROXYKIT_REQUIRE_IPVS=1", err)
		}
		t.Skipf("this kernel has no IPVS (%v): run it in a VM with hack/vmtest.sh ./examples/proxy/ -- -run 'TestProxy$/ipvs'", err)
	}
}

// bpffs mounts a bpffs of the test's own and returns its directory.
func bpffs(t *testing.T) string {
	t.Helper()
	return testnet.BPFFS(t)
}

// testLog writes log lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestLoadKubeconfig checks that the daemon picks the current context and
// resolves relative paths against the kubeconfig's directory.
func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pki/ca.crt", "pki/client.key", "client.crt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc := `apiVersion: v1
kind: Config
current-context: node
contexts:
- name: other
  context: {cluster: nowhere, user: nobody}
- name: node
  context: {cluster: c1, user: u1}
clusters:
- name: c1
  cluster:
    server: https://192.0.2.10:6443
    certificate-authority: pki/ca.crt
    tls-server-name: api.example
users:
- name: u1
  user:
    token: secret-token
    client-certificate: ABS/client.crt
    client-key: pki/client.key
`
	kc = strings.Replace(kc, "ABS", dir, 1)
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadKubeconfig(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://192.0.2.10:6443" || cfg.BearerToken != "secret-token" || cfg.ServerName != "api.example" {
		t.Errorf("host %q token %q server name %q", cfg.Host, cfg.BearerToken, cfg.ServerName)
	}
	if cfg.CAFile != filepath.Join(dir, "pki/ca.crt") || cfg.KeyFile != filepath.Join(dir, "pki/client.key") || cfg.CertFile != filepath.Join(dir, "client.crt") {
		t.Errorf("files not resolved against the kubeconfig's directory: %q %q %q", cfg.CAFile, cfg.KeyFile, cfg.CertFile)
	}
	if _, err := loadKubeconfig(filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("a missing file loaded")
	}
}

// writeConfigFile writes a configuration file and returns its path.
func writeConfigFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freePort returns a TCP port of 127.0.0.1 free just now: kube-proxy's
// validation wants a port from 1 to 65535.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestInitOnly checks --init-only as kube-proxy's: the node settings of
// the configuration are made (conntrack timeouts and iptables mode's
// route_localnet, in node1's namespace), and the command returns without
// serving or programming anything.
func TestInitOnly(t *testing.T) {
	sandbox.RequirePrivilege(t)
	tp, err := sandbox.New(t.Context(), sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Error(err)
		}
	})
	healthz := freePort(t)
	file := writeConfigFile(t, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
`, healthz, freePort(t)))
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: tp.Node1.Name}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	err = command(ctx, []string{"--init-only", "--config", file, "--hostname-override", tp.Node1.Name, "--netns", tp.Node1.NetNSPath()},
		io.Discard, testLog{t}, func(*settings) (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("--init-only took %v", d)
	}
	for key, want := range map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": "7200",
		"net/ipv4/conf/all/route_localnet":                   "1",
	} {
		if out, err := tp.Node1.Exec(ctx, "cat", "/proc/sys/"+key); err != nil || strings.TrimSpace(out) != want {
			t.Errorf("%s in node1: %q %v, want %s", key, out, err, want)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", healthz), time.Second); err == nil {
		c.Close()
		t.Error("--init-only serves the healthz server")
	}
	// Nothing was programmed: no iptables chain of ours in node1.
	if out, err := tp.Node1.Exec(ctx, "iptables-save"); err == nil && strings.Contains(out, "PROXYKIT-") {
		t.Errorf("--init-only programmed iptables:\n%s", out)
	}
}
