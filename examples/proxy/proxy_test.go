package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

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
	for _, backend := range []string{"nftables", "ebpf"} {
		t.Run(backend, func(t *testing.T) { testProxy(t, backend) })
	}
}

func testProxy(t *testing.T, backend string) {
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
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: tp.Node1.Name}})
	o := options{
		backend:       backend,
		nodeName:      tp.Node1.Name,
		netns:         tp.Node1.NetNSPath(),
		clusterCIDRs:  tp.PodNetworks(),
		minSyncPeriod: 50 * time.Millisecond,
		syncPeriod:    30 * time.Second,
		metricsAddr:   "127.0.0.1:0",
		healthzAddr:   "127.0.0.1:0",
		logger:        slog.New(slog.NewTextHandler(testLog{t}, nil)),
	}
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
		o.ebpfCgroup = cg.Path()
		o.ebpfPinPath = bpffs(t)
		o.scheduler = proxier.SchedulerMaglev
	}
	d := &daemon{opts: o, client: client, ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	select {
	case <-d.ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}

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

	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(t, "http://"+d.healthzAddr.String()+path)
		if code != http.StatusOK || !strings.Contains(body, "lastUpdated") {
			t.Errorf("%s: %d %q", path, code, body)
		}
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
	// A stopped proxy leaves the dataplane for its successor.
	answeredBy(t, &tp.Node1.Host, vip, p2.Name)

	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if err := runCleanup(cctx, o); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if r := tp.Node1.TCP(vip, 500*time.Millisecond); r.Outcome == sandbox.Answered {
		t.Errorf("after --cleanup the service still answers: %v", r)
	}
	if o.ebpfPinPath != "" {
		if es, err := os.ReadDir(o.ebpfPinPath); err != nil || len(es) > 2 { // maps.debug, progs.debug
			t.Errorf("after --cleanup the pin path holds %v (%v)", es, err)
		}
	}
}

// bpffs mounts a bpffs of the test's own and returns its directory.
func bpffs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs: %v", err)
		}
	})
	return dir
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
	cfg, err := loadKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://192.0.2.10:6443" || cfg.BearerToken != "secret-token" || cfg.ServerName != "api.example" {
		t.Errorf("host %q token %q server name %q", cfg.Host, cfg.BearerToken, cfg.ServerName)
	}
	if cfg.CAFile != filepath.Join(dir, "pki/ca.crt") || cfg.KeyFile != filepath.Join(dir, "pki/client.key") || cfg.CertFile != filepath.Join(dir, "client.crt") {
		t.Errorf("files not resolved against the kubeconfig's directory: %q %q %q", cfg.CAFile, cfg.KeyFile, cfg.CertFile)
	}
	if _, err := loadKubeconfig(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file loaded")
	}
}

// TestSchedulerFlag checks the scheduler flag and the options that
// cannot go with it.
func TestSchedulerFlag(t *testing.T) {
	var s proxier.Scheduler
	f := schedulerFlag{&s}
	if err := f.Set("Maglev"); err != nil || s != proxier.SchedulerMaglev || f.String() != "mh" {
		t.Errorf("maglev: %q, %v", s, err)
	}
	if err := f.Set("fifo"); err == nil {
		t.Error("fifo accepted")
	}
	if err := (options{backend: "nftables", scheduler: proxier.SchedulerSourceHashing}).check(); err == nil {
		t.Error("--scheduler sh accepted for nftables")
	}
	for _, o := range []options{{backend: "nftables", scheduler: proxier.SchedulerRandom}, {backend: "ipvs", scheduler: proxier.SchedulerSourceHashing}} {
		if err := o.check(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	cfg := options{scheduler: proxier.SchedulerMaglev, ebpfCgroup: "/sys/fs/cgroup", masqueradeMark: 0x10}.config(nil)
	if cfg.IPVS.Scheduler != proxier.SchedulerMaglev || cfg.EBPF.Scheduler != proxier.SchedulerMaglev || cfg.EBPF.CgroupPath != "/sys/fs/cgroup" || cfg.NFTables.MasqueradeBit != 0x10 {
		t.Errorf("config: %+v", cfg)
	}
}

// TestFlags checks the CIDR list flag.
func TestFlags(t *testing.T) {
	var ps []netip.Prefix
	l := prefixList{&ps}
	if err := l.Set("10.244.0.0/16, fd00:10:244::/48"); err != nil {
		t.Fatal(err)
	}
	if err := l.Set("192.0.2.7/24"); err != nil {
		t.Fatal(err)
	}
	if got := l.String(); got != "10.244.0.0/16,fd00:10:244::/48,192.0.2.0/24" {
		t.Errorf("got %q", got)
	}
	if err := l.Set("nonsense"); err == nil {
		t.Error("nonsense accepted")
	}
}

// TestManifest checks that deploy/daemonset.yaml decodes strictly and
// grants what the daemon uses, on the host network, privileged.
func TestManifest(t *testing.T) {
	data, err := os.ReadFile("deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		role *rbacv1.ClusterRole
		ds   *appsv1.DaemonSet
		kind []string
	)
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		kind = append(kind, tm.Kind)
		var obj any
		switch tm.Kind {
		case "ServiceAccount":
			obj = &v1.ServiceAccount{}
		case "ClusterRole":
			role = &rbacv1.ClusterRole{}
			obj = role
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			obj = ds
		default:
			t.Fatalf("unexpected kind %q", tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %v", tm.Kind, err)
		}
	}
	if role == nil || ds == nil || len(kind) != 4 {
		t.Fatalf("kinds %v", kind)
	}
	can := func(group, resource, verb string) bool {
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	for _, want := range [][3]string{
		{"", "services", "list"}, {"", "services", "watch"},
		{"discovery.k8s.io", "endpointslices", "list"}, {"discovery.k8s.io", "endpointslices", "watch"},
		{"", "nodes", "get"}, {"", "nodes", "list"}, {"", "nodes", "watch"},
	} {
		if !can(want[0], want[1], want[2]) {
			t.Errorf("the ClusterRole does not allow %s %s/%s", want[2], want[0], want[1])
		}
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if !spec.HostNetwork || c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.Privileged, false) {
		t.Error("the DaemonSet must run privileged on the host network")
	}
	if !slices.Contains(c.Args, "--hostname-override=$(NODE_NAME)") || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("args %v, liveness probe %+v", c.Args, c.LivenessProbe)
	}
}
