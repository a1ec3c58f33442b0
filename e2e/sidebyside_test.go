package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/internal/testcluster"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Side-by-side parameters.
const (
	sideBySideChanges = 100
	// sideBySideMinSync is both proxies' minSyncPeriod; every API write
	// comes more than this after the previous change was answered, so
	// neither rate limiter holds a change back (as in
	// TestProgrammingLatency).
	sideBySideMinSync = 200 * time.Millisecond
	sideBySideLimit   = 10 * time.Second // per change and proxy
)

// kubeProxyModes are the modes both proxies run in, among the backends
// under test (forEachBackend). kube-proxy's ipvs mode is left out: it
// needs the ip_vs module, which it loads with modprobe into the host's
// kernel (the kernel of our CI has no IPVS at all), and it is deprecated
// upstream; ebpf is proxykit's own.
var kubeProxyModes = []string{"nftables", "iptables"}

// TestKubeProxySideBySide runs the real kube-proxy (upstream's
// cmd/kube-proxy at testcluster.KubernetesVersion, hack/kubeproxy/build.sh)
// and examples/proxy against one API server with one
// KubeProxyConfiguration file, each in the node1 namespace of a sandbox of
// its own, drives sideBySideChanges Service and EndpointSlice changes and
// checks real traffic through both after every change: it fails if either
// proxy does not deliver a change within sideBySideLimit, or if a service
// does not answer from its endpoint at the end. For each change it
// measures, per proxy, the network programming latency from the API write
// to the first successful connection through the change, and after the
// run it reads each process's resident memory; the figures go to the log
// on lines starting with E2E-SIDEBYSIDE (logged, never asserted).
//
// The two sandboxes are identical testnet topologies: the same node and
// pod names and addresses in different namespaces. So one Node "node1"
// (both proxies' hostnameOverride, with node1's internal addresses) and
// one EndpointSlice per Service serve both, and the same probe means the
// same thing in each. Both proxies only read the API (and record events).
//
// kube-proxy cannot be pointed at another namespace, so it runs inside
// its sandbox's node1, where the host's loopback is out of reach: a relay
// in the test listens on 127.0.0.1:<the API server's port> inside that
// namespace and copies each connection to the API server, so both
// proxies use the same kubeconfig (and its certificate, issued for
// 127.0.0.1). examples/proxy runs in the host namespace with --netns, as
// in the other e2e tests. The configuration leaves host-wide state alone
// (conntrack maxPerCore 0); the test checks that the host's conntrack
// settings, forwarding and rule listings did not change.
func TestKubeProxySideBySide(t *testing.T) {
	forEachBackend(t, func(t *testing.T, mode string) {
		if !slices.Contains(kubeProxyModes, mode) {
			t.Skipf("not compared with kube-proxy in mode %s: only %v are", mode, kubeProxyModes)
		}
		runSideBySide(t, mode)
	})
}

// sideBySide is one mode's setup: the control plane, examples/proxy
// programming the node1 of one sandbox (env.tp, env.proxy) and kube-proxy
// running in node1 of the other.
type sideBySide struct {
	*env
	kubeProxy *daemon
	kpTP      *testnet.Topology
}

// proxyUnderTest is one of the two proxies with its sandbox.
type proxyUnderTest struct {
	name string
	tp   *testnet.Topology
	d    *daemon
}

func (s *sideBySide) proxies() []proxyUnderTest {
	return []proxyUnderTest{{"kube-proxy", s.kpTP, s.kubeProxy}, {"proxykit", s.tp, s.proxy}}
}

// newSideBySide sets up both proxies in mode; it skips without root or
// without the binaries.
func newSideBySide(t *testing.T, mode string) *sideBySide {
	t.Helper()
	testcluster.RequireBinaries(t)
	testnet.RequireRoot(t)
	kpBin := kubeProxyBinary(t)
	bin := proxyBinary(t)
	host, proxykitHost := snapshotHost(), hostTables()
	// Registered first, so it runs last: after both proxies stopped
	// and the sandboxes are gone.
	t.Cleanup(func() {
		host.check(t)
		proxykitHost.check(t)
	})

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &sideBySide{env: &env{t: t, backend: mode, ctx: ctx}}
	s.cluster = testcluster.Start(t, testcluster.Options{})
	s.cs = s.cluster.Client(t)
	kubeconfig := s.serviceAccount()

	s.tp = testnet.New(t, testnet.Options{Node1Pods: 3, Node2Pods: 2})
	s.kpTP = testnet.New(t, testnet.Options{Node1Pods: 3, Node2Pods: 2})
	s.createObjects()

	api, err := url.Parse(s.cluster.Host)
	if err != nil {
		t.Fatal(err)
	}
	startRelay(t, s.kpTP.Node1.NS, api.Host, nil, api.Host)

	metrics, healthz := freeAddr(t), freeAddr(t)
	config := writeKubeProxyConfig(t, mode, kubeconfig, metrics, healthz, s.tp.Node1)
	s.proxy = startDaemon(t, bin, s.tp.Node1.Path(), "--config="+config, "--netns="+s.tp.Node1.Path(), "-v=2")
	s.kubeProxy = startKubeProxy(t, kpBin, s.kpTP.Node1, metrics, healthz, "--config="+config, "-v=2")
	return s
}

// serviceAccount applies the RBAC of examples/proxy's manifest and returns
// a kubeconfig of its ServiceAccount, checked not to be an admin; both
// proxies use it (it grants what kube-proxy's system:node-proxier does).
func (s *sideBySide) serviceAccount() string {
	t := s.t
	t.Helper()
	kubeconfig := s.cluster.ManifestKubeconfig(t, manifest)
	s.checkNotAdmin(kubeconfig)
	return kubeconfig
}

// createObjects creates the test's namespace and the Node node1 with
// node1's internal addresses (kube-proxy waits up to 30 s for a Node with
// addresses, and takes its node IPs from it).
func (s *sideBySide) createObjects() {
	t := s.t
	t.Helper()
	if _, err := s.cs.CoreV1().Namespaces().Create(s.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n1 := s.tp.Node1
	node, err := s.cs.CoreV1().Nodes().Create(s.ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testnet.Node1Name, Labels: map[string]string{
		v1.LabelHostname: testnet.Node1Name, v1.LabelTopologyZone: "zone-a", v1.LabelOSStable: "linux",
	}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: n1.IPv4.String()},
		{Type: v1.NodeInternalIP, Address: n1.IPv6.String()},
		{Type: v1.NodeHostName, Address: testnet.Node1Name},
	}
	if _, err := s.cs.CoreV1().Nodes().UpdateStatus(s.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeKubeProxyConfig writes the KubeProxyConfiguration both proxies read
// and returns its path. Node ports are served on node1's addresses toward
// the client only (not loopback, so kube-proxy's iptables mode does not
// set route_localnet); conntrack maxPerCore 0 leaves nf_conntrack_max and
// the hash size, which are the host's, alone. The servers' addresses are
// free on the host's loopback, where examples/proxy serves; kube-proxy
// serves the same addresses on its namespace's loopback.
func writeKubeProxyConfig(t *testing.T, mode, kubeconfig, metrics, healthz string, node1 *testnet.Node) string {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %q
hostnameOverride: %q
clientConnection:
  kubeconfig: %q
clusterCIDR: %q
metricsBindAddress: %q
healthzBindAddress: %q
nodePortAddresses: [%q, %q]
conntrack:
  maxPerCore: 0
  min: 0
iptables:
  minSyncPeriod: %q
  localhostNodePorts: false
nftables:
  minSyncPeriod: %q
`, mode, testnet.Node1Name, kubeconfig,
		testnet.PodNetworkIPv4.String()+","+testnet.PodNetworkIPv6.String(),
		metrics, healthz,
		netip.PrefixFrom(node1.ExternalIPv4, 32).String(), netip.PrefixFrom(node1.ExternalIPv6, 128).String(),
		sideBySideMinSync.String(), sideBySideMinSync.String())
	p := filepath.Join(t.TempDir(), "kube-proxy-config.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("KubeProxyConfiguration of both proxies (%s):\n%s", p, cfg)
	return p
}

// probe is what shows that a change took effect: from which host of a
// sandbox to connect where, and which pod must answer.
type probe struct {
	from func(tp *testnet.Topology) *testnet.Host
	dst  netip.AddrPort
	want string
}

// fromPod probes from node1-pod3, the client pod; fromClient from the
// client outside the cluster.
func fromPod(tp *testnet.Topology) *testnet.Host    { return &tp.Node1.Pods[2].Host }
func fromClient(tp *testnet.Topology) *testnet.Host { return tp.Client }

// The kinds of change, in the order they cycle through for each service.
const (
	kindCreate   = "new-service"      // a ClusterIP Service (its EndpointSlice written before)
	kindMove     = "endpoint-move"    // its only endpoint moves to another pod
	kindNodePort = "to-nodeport"      // the Service becomes a NodePort Service
	kindMoveNP   = "endpoint-move-np" // the endpoint moves again, probed through the node port
)

var changeKinds = []string{kindCreate, kindMove, kindNodePort, kindMoveNP}

// tracked is a service the run created and the pod behind it.
type tracked struct {
	svc *v1.Service
	pod *testnet.Pod
}

func runSideBySide(t *testing.T, mode string) {
	s := newSideBySide(t, mode)
	n1, n2 := s.tp.Node1, s.tp.Node2
	pods := []*testnet.Pod{n1.Pods[0], n1.Pods[1], n2.Pods[0], n2.Pods[1]}
	lat := map[string]map[string][]time.Duration{} // proxy -> kind ("all" too) -> latencies
	for _, p := range s.proxies() {
		lat[p.name] = map[string][]time.Duration{}
	}
	var services []*tracked
	cur := 0
	began := time.Now()
	for i := range sideBySideChanges {
		kind := changeKinds[i%len(changeKinds)]
		if kind != kindNodePort {
			cur = (cur + 1) % len(pods)
		}
		time.Sleep(sideBySideMinSync + 50*time.Millisecond)
		var start time.Time
		var pr probe
		switch kind {
		case kindCreate:
			name := fmt.Sprintf("sbs-%03d", len(services))
			// The EndpointSlice goes first, in a sync of its own, so
			// the Service's creation is the one change measured.
			s.setEndpoints(name, model.IPv4, pods[cur])
			time.Sleep(sideBySideMinSync + 50*time.Millisecond)
			start = time.Now()
			services = append(services, &tracked{svc: s.createService(name), pod: pods[cur]})
			pr = probe{fromPod, clusterIP(t, services[len(services)-1].svc, model.IPv4), pods[cur].Name}
		case kindMove:
			sv := services[len(services)-1]
			start = time.Now()
			s.setEndpoints(sv.svc.Name, model.IPv4, pods[cur])
			sv.pod = pods[cur]
			pr = probe{fromPod, clusterIP(t, sv.svc, model.IPv4), pods[cur].Name}
		case kindNodePort:
			sv := services[len(services)-1]
			start = time.Now()
			sv.svc = s.updateService(sv.svc.Name, nodePort)
			pr = probe{fromClient, s.nodePortAddr(sv.svc), sv.pod.Name}
		case kindMoveNP:
			sv := services[len(services)-1]
			start = time.Now()
			s.setEndpoints(sv.svc.Name, model.IPv4, pods[cur])
			sv.pod = pods[cur]
			pr = probe{fromClient, s.nodePortAddr(sv.svc), pods[cur].Name}
		}
		for name, took := range s.measure(t, i, kind, start, pr) {
			lat[name][kind] = append(lat[name][kind], took)
			lat[name]["all"] = append(lat[name]["all"], took)
		}
	}
	wall := time.Since(began)
	s.checkAll(t, services)
	s.report(t, mode, lat, wall)
}

// nodePortAddr is the Service's node port on node1's address toward the
// client.
func (s *sideBySide) nodePortAddr(svc *v1.Service) netip.AddrPort {
	s.t.Helper()
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
		s.t.Fatalf("service %s has no node port: %+v", svc.Name, svc.Spec.Ports)
	}
	return netip.AddrPortFrom(s.tp.Node1.ExternalIPv4, uint16(svc.Spec.Ports[0].NodePort))
}

// measure probes both sandboxes at once, from the same API write at
// start, and returns each proxy's latency; it fails the test if either
// proxy did not deliver the change.
func (s *sideBySide) measure(t *testing.T, i int, kind string, start time.Time, pr probe) map[string]time.Duration {
	t.Helper()
	type result struct {
		name string
		took time.Duration
		err  error
	}
	ps := s.proxies()
	results := make(chan result, len(ps))
	for _, p := range ps {
		go func() {
			took, err := firstAnswer(pr.from(p.tp), pr.dst, start, sideBySideLimit, latencyStep, pr.want)
			results <- result{p.name, took, err}
		}()
	}
	out := map[string]time.Duration{}
	var errs []string
	for range ps {
		r := <-results
		if r.err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.name, r.err))
		}
		out[r.name] = r.took
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		t.Fatalf("change %d (%s): traffic does not follow the API: %s", i, kind, strings.Join(errs, "; "))
	}
	return out
}

// checkAll checks at the end that every service answers, in both
// sandboxes, from its current endpoint on its cluster IP (from the client
// pod) and node port (from the outside client).
func (s *sideBySide) checkAll(t *testing.T, services []*tracked) {
	t.Helper()
	for _, p := range s.proxies() {
		for _, sv := range services {
			checks := []probe{{fromPod, clusterIP(t, sv.svc, model.IPv4), sv.pod.Name}}
			if sv.svc.Spec.Type == v1.ServiceTypeNodePort {
				checks = append(checks, probe{fromClient, s.nodePortAddr(sv.svc), sv.pod.Name})
			}
			for _, c := range checks {
				h := c.from(p.tp)
				if r, _ := answer(t, h, c.dst); r.Server != c.want {
					t.Errorf("%s: %s → %s (%s) answered by %s, want %s", p.name, h.Name, c.dst, sv.svc.Name, r.Server, c.want)
				}
			}
		}
	}
}

// report logs, per proxy, the latencies and the process's memory and CPU
// time.
func (s *sideBySide) report(t *testing.T, mode string, lat map[string]map[string][]time.Duration, wall time.Duration) {
	t.Helper()
	for _, p := range s.proxies() {
		u, err := usage(p.d.cmd.Process.Pid)
		if err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
		l := lat[p.name]
		var kinds []string
		for _, k := range changeKinds {
			kinds = append(kinds, fmt.Sprintf("%s median=%v p99=%v", k, pct(l[k], 50), pct(l[k], 99)))
		}
		engine := "n/a"
		if v, err := p.d.histogramQuantiles("kubeproxy_network_programming_duration_seconds"); err == nil {
			engine = v
		}
		t.Logf("E2E-SIDEBYSIDE mode=%s proxy=%s changes=%d median=%v p99=%v max=%v %s | %s | minSyncPeriod=%v probe-step=%v wall=%v | own metric network_programming_duration: %s",
			mode, p.name, len(l["all"]), pct(l["all"], 50), pct(l["all"], 99), pct(l["all"], 100), u,
			strings.Join(kinds, " | "), sideBySideMinSync, latencyStep, wall.Round(time.Second), engine)
	}
}

// TestKubeProxyVersionMatchesBuild checks that hack/kubeproxy/build.sh
// builds kube-proxy at the version the control plane runs
// (testcluster.KubernetesVersion, which names the binary), with every
// staging module replaced by its release of the same version.
func TestKubeProxyVersionMatchesBuild(t *testing.T) {
	const gomod = "../hack/kubeproxy/kube-proxy/go.mod"
	b, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no k8s.io/kubernetes requirement in %s", gomod)
	}
	if got := string(m[1]); got != testcluster.KubernetesVersion {
		t.Errorf("%s pins %s, testcluster.KubernetesVersion is %s", gomod, got, testcluster.KubernetesVersion)
	}
	staging := "v0" + testcluster.KubernetesVersion[len("v1"):]
	var wrong []string
	for _, r := range regexp.MustCompile(`(?m)^\s*(k8s\.io/\S+)\s+=>\s+k8s\.io/\S+\s+(v\S+)`).FindAllSubmatch(b, -1) {
		if string(r[2]) != staging {
			wrong = append(wrong, string(r[1])+" => "+string(r[2]))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("replacements not at %s: %v", staging, wrong)
	}
	if !regexp.MustCompile(`(?m)^\s*k8s\.io/kube-proxy\s+=>`).Match(b) {
		t.Errorf("no replacement of k8s.io/kube-proxy")
	}
}
