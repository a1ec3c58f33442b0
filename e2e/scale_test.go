package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testcluster"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// The opt-in scale measurement (TestInformerMemoryAtScale): none of it
// runs in `go test ./...` unless EnvScale is set.
const (
	// EnvScale is the number of Services (and EndpointSlices) of
	// TestInformerMemoryAtScale, e.g. 10000; unset, the test skips.
	EnvScale = "PROXYKIT_E2E_SCALE"
	// EnvScaleBaseline adds proxies to compare with: comma-separated
	// examples/proxy builds, e.g. one without the informer transforms.
	// Each is the path of a binary or a git revision of this repository
	// (e.g. 732b866~1, the commit before the transforms), which the test
	// builds from `git archive` into a temporary directory (the work tree
	// is not touched).
	EnvScaleBaseline = "PROXYKIT_E2E_SCALE_BASELINE"
	// EnvScaleProfiles is a directory where the test writes each
	// proxy's heap profile (/debug/pprof/heap?gc=1) at the end, as
	// <mode>-<proxy>.heap, for `go tool pprof -top`.
	EnvScaleProfiles = "PROXYKIT_E2E_SCALE_PROFILES"
)

// Scale parameters.
const (
	scaleEndpoints  = 10  // per EndpointSlice, as the issue asks
	scaleNamespaces = 100 // the objects are spread over this many namespaces
	scaleWriters    = 16  // concurrent API writers
	// scaleSyncLimit bounds the wait for a proxy to program everything:
	// kube-proxy's first nftables sync of 100,000 endpoints takes minutes
	// (BENCHMARKS.md: `nft -f` of its layout took 177 s at 10,000
	// services on this kind of machine).
	scaleSyncLimit = 30 * time.Minute
	// scaleSettle is how long the test samples the proxies' resident
	// memory (every scaleSample) after every proxy synced, before it
	// reads the Go heap: two of the 30 s periodic resyncs of both.
	scaleSettle = 65 * time.Second
	scaleSample = time.Second
	// scaleProbe is the one Service with a real endpoint (node1-pod1),
	// probed through every proxy: an answer shows that it programmed the
	// Services of the list.
	scaleProbe = "scale-probe"
)

// TestInformerMemoryAtScale measures the resident memory of examples/proxy
// and of the real kube-proxy with many Services (issue #22's "lean
// informers"). It is not part of the normal test run: it writes 2×N API
// objects and takes minutes, so it skips unless PROXYKIT_E2E_SCALE=N is
// set. From the repository's root, as root:
//
//	sudo hack/testcluster/build.sh && sudo hack/kubeproxy/build.sh
//	PROXYKIT_E2E_SCALE=10000 PROXYKIT_E2E_BACKENDS=nftables \
//	  PROXYKIT_E2E_SCALE_BASELINE=732b866~1,732b866 PROXYKIT_E2E_SCALE_PROFILES=/tmp/scale-heap \
//	  go test ./e2e/ -run TestInformerMemoryAtScale -count=1 -v -timeout=90m
//
// It starts the API server and writes N Services and N EndpointSlices of
// scaleEndpoints endpoints each with scaleWriters concurrent writers (no
// client-side rate limit), as real clients leave them: each with the
// managed fields of its writer, half of the Services as `kubectl apply`
// writes them (the last-applied-configuration annotation), the other half
// as Helm does (its labels and annotations), every tenth a NodePort
// Service (internal/scale's addresses and node ports); the EndpointSlices
// as the EndpointSlice controller writes them (the Service's labels, an
// owner reference, the trigger-time annotation, a target reference to a
// Pod per endpoint, nodes and zones). Then, per mode (PROXYKIT_E2E_BACKENDS,
// among nftables and iptables), it starts in a sandbox of its own each:
// examples/proxy as built from the work tree, the baselines of
// PROXYKIT_E2E_SCALE_BASELINE if set, and kube-proxy, all with one
// KubeProxyConfiguration as in TestKubeProxySideBySide (plus
// enableProfiling), against the populated API server: what a restarted
// DaemonSet pod does. It waits until each has programmed the initial list
// (its first sync after at least N+1 Service and N+1 EndpointSlice events,
// and the probe Service answering through it), samples their VmRSS every
// scaleSample for scaleSettle, and logs per process, on lines starting
// with E2E-SCALE: VmRSS and VmHWM at its sync, VmRSS over the window (min,
// median, max) and VmHWM at its end, the Go heap
// (go_memstats_heap_inuse_bytes, and go_memstats_heap_alloc_bytes after a
// forced collection: the live heap), its CPU time, and the peak resident
// memory of the helper processes it ran (kube-proxy's nft or
// iptables-restore), sampled every 100 ms. Nothing is asserted but that
// every proxy programs the probe Service.
func TestInformerMemoryAtScale(t *testing.T) {
	n := scaleServices(t)
	testcluster.RequireBinaries(t)
	testnet.RequireRoot(t)
	kpBin := kubeProxyBinary(t)
	bin := proxyBinary(t)
	baselines := baselineBinaries(t)
	t.Logf("E2E-SCALE loadavg at start: %s", loadavg())
	t.Logf("E2E-SCALE %s", etcdVersion())
	t.Cleanup(func() { t.Logf("E2E-SCALE loadavg at end: %s", loadavg()) })

	host, proxykitHost := snapshotHost(), hostTables()
	t.Cleanup(func() {
		host.check(t)
		proxykitHost.check(t)
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cluster := testcluster.Start(t, testcluster.Options{})
	base := &sideBySide{env: &env{t: t, ctx: ctx, cluster: cluster, cs: cluster.Client(t)}}
	kubeconfig := base.serviceAccount()
	began := time.Now()
	writeScaleObjects(t, ctx, cluster, n)
	t.Logf("E2E-SCALE wrote %d Services and %d EndpointSlices (%d endpoints each) in %v with %d writers",
		n, n, scaleEndpoints, time.Since(began).Round(time.Second), scaleWriters)

	forEachBackend(t, func(t *testing.T, mode string) {
		if !slices.Contains(kubeProxyModes, mode) {
			t.Skipf("not compared with kube-proxy in mode %s: only %v are", mode, kubeProxyModes)
		}
		runScale(t, &env{t: t, backend: mode, ctx: ctx, cluster: cluster, cs: base.cs}, kubeconfig, n, bin, baselines, kpBin)
	})
}

// scaleServices returns N from EnvScale, or skips the test.
func scaleServices(t *testing.T) int {
	t.Helper()
	v := os.Getenv(EnvScale)
	if v == "" {
		t.Skipf("opt-in measurement (writes 2×N API objects, takes minutes): set %s=N, e.g. %s=10000 %s=nftables %s=732b866~1 go test ./e2e/ -run TestInformerMemoryAtScale -v -timeout=90m (as root)",
			EnvScale, EnvScale, EnvBackends, EnvScaleBaseline)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 60000 {
		t.Fatalf("%s=%q: want a number of Services from 1 to 60000 (the service CIDR holds 65,536)", EnvScale, v)
	}
	return n
}

// baseline is an examples/proxy to compare with.
type baseline struct{ name, bin string }

// baselineBinaries returns the examples/proxy builds of EnvScaleBaseline.
func baselineBinaries(t *testing.T) []baseline {
	t.Helper()
	var out []baseline
	for _, v := range strings.Split(os.Getenv(EnvScaleBaseline), ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, baseline{"proxykit@" + filepath.Base(v), baselineBinary(t, v)})
		}
	}
	return out
}

// baselineBinary returns the examples/proxy v (a path, or a revision it
// builds).
func baselineBinary(t *testing.T, v string) string {
	t.Helper()
	if fi, err := os.Stat(v); err == nil && !fi.IsDir() {
		return v
	}
	start := time.Now()
	dir := t.TempDir()
	archive := exec.Command("git", "-C", "..", "archive", "--format=tar", v)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var aerr, terr strings.Builder
	archive.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("%s=%s is neither a file nor a revision: git archive: %v %s", EnvScaleBaseline, v, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v %s", v, err, terr.String())
	}
	out := filepath.Join(dir, "proxy")
	build := exec.Command(goTool(), "build", "-o", out, "./examples/proxy")
	build.Dir = dir
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build examples/proxy at %s: %v\n%s", v, err, b)
	}
	rev, _ := exec.Command("git", "-C", "..", "rev-parse", "--short", v).Output()
	t.Logf("E2E-SCALE baseline: examples/proxy at %s (%s) built in %v", v, strings.TrimSpace(string(rev)), time.Since(start).Round(time.Second))
	return out
}

// etcdVersion names the control plane's etcd. It decides how informers
// fetch their initial lists: kube-apiserver streams them (WatchList, which
// client-go uses by default since 1.35) only when etcd has
// RequestWatchProgress (3.4.31+, 3.5.13+); else client-go falls back to a
// paginated LIST, held whole before the informer transforms see it.
func etcdVersion() string {
	bins, err := testcluster.FindBinaries()
	if err != nil {
		return "etcd: " + err.Error()
	}
	out, err := exec.Command(bins.Etcd, "--version").Output()
	v, _, _ := strings.Cut(string(out), "\n")
	if err != nil {
		v = err.Error()
	}
	return "etcd " + bins.Etcd + ": " + strings.TrimSpace(v)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// scaleNS is the namespace of object i.
func scaleNS(i, n int) string { return fmt.Sprintf("scale-%02d", i%min(n, scaleNamespaces)) }

// randomUID returns a random UUID-shaped string, as the API server's.
func randomUID(r *rand.Rand) types.UID {
	return types.UID(fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, 0x8000|r.Uint32()&0x3fff, r.Uint64()&0xffffffffffff))
}

func randomSuffix(r *rand.Rand, n int) string {
	const chars = "bcdfghjklmnpqrstvwxz2456789" // the API server's generateName alphabet
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[r.IntN(len(chars))]
	}
	return string(b)
}

// scaleService returns Service i as a user's tool writes it, and the
// tool's field manager: the even ones as `kubectl apply` (client side)
// writes them, with the applied manifest in the last-applied-configuration
// annotation, the odd ones as Helm does.
func scaleService(i int, s scale.Service, ns string) (*v1.Service, string) {
	release := fmt.Sprintf("release-%04d", i/4)
	labels := map[string]string{
		"app.kubernetes.io/name":      s.Name,
		"app.kubernetes.io/instance":  release,
		"app.kubernetes.io/component": "backend",
		"app.kubernetes.io/part-of":   "shop",
		"app.kubernetes.io/version":   "1.27.3",
	}
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Name, Labels: labels},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeClusterIP,
			Selector: map[string]string{"app.kubernetes.io/name": s.Name, "app.kubernetes.io/instance": release},
			Ports:    []v1.ServicePort{{Name: scale.PortName, Protocol: v1.ProtocolTCP, Port: scale.Port, TargetPort: intstr.FromInt32(scale.TargetPort)}},
		},
	}
	if s.NodePort != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = int32(s.NodePort)
	}
	if i%2 == 1 {
		labels["app.kubernetes.io/managed-by"] = "Helm"
		labels["helm.sh/chart"] = "shop-backend-4.12.0"
		svc.Annotations = map[string]string{"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": ns}
		return svc, "helm"
	}
	applied, err := json.Marshal(svc) // the manifest, without what the server adds
	if err != nil {
		panic(err)
	}
	svc.Annotations = map[string]string{v1.LastAppliedConfigAnnotation: string(applied) + "\n"}
	return svc, "kubectl-client-side-apply"
}

// scaleSlice returns the EndpointSlice of the created Service svc as the
// EndpointSlice controller writes it, and its field manager.
func scaleSlice(r *rand.Rand, i int, s scale.Service, svc *v1.Service) (*discoveryv1.EndpointSlice, string) {
	labels := map[string]string{
		discoveryv1.LabelServiceName: svc.Name,
		discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
	}
	for k, v := range svc.Labels {
		labels[k] = v
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, GenerateName: svc.Name + "-", Labels: labels,
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(scale.PortName), Port: ptr.To(int32(scale.TargetPort)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	rs := randomSuffix(r, 10)
	for j, a := range s.Endpoints {
		k := i*scaleEndpoints + j
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("worker-%03d", k%250)),
			Zone:       ptr.To([]string{"zone-a", "zone-b", "zone-c"}[k%3]),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace,
				Name: svc.Name + "-" + rs + "-" + randomSuffix(r, 5), UID: randomUID(r)},
		})
	}
	return sl, "kube-controller-manager"
}

// writeScaleObjects creates the namespaces, n Services and their
// EndpointSlices (internal/scale's addresses and node ports) with
// scaleWriters concurrent writers and no client-side rate limit.
func writeScaleObjects(t *testing.T, ctx context.Context, cluster *testcluster.Cluster, n int) {
	t.Helper()
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = -1, 1000 // no client-side rate limit
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range min(n, scaleNamespaces) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNS(i, n)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svcs := scale.Services(n, scaleEndpoints)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
		done     atomic.Int64
	)
	fail := func(err error) {
		once.Do(func() { firstErr = err; cancel() })
	}
	for w := range scaleWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 22))
			for i := range next {
				svc, mgr := scaleService(i, svcs[i], scaleNS(i, n))
				got, err := create(ctx, func() (*v1.Service, error) {
					return cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: mgr})
				})
				if err != nil {
					fail(fmt.Errorf("service %s/%s: %w", svc.Namespace, svc.Name, err))
					continue
				}
				sl, mgr := scaleSlice(r, i, svcs[i], got)
				if _, err := create(ctx, func() (*discoveryv1.EndpointSlice, error) {
					return cs.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{FieldManager: mgr})
				}); err != nil {
					fail(fmt.Errorf("endpointslice of %s/%s: %w", svc.Namespace, svc.Name, err))
					continue
				}
				if d := done.Add(1); d%int64(max(n/10, 1)) == 0 {
					t.Logf("E2E-SCALE %d/%d Services with their EndpointSlices written", d, n)
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}

// create retries a create the API server refused for overload (429, 5xx,
// timeouts) a few times.
func create[T any](ctx context.Context, f func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		o, err := f()
		if err == nil || attempt == 5 || ctx.Err() != nil ||
			!(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return o, err
		}
		time.Sleep(time.Duration(attempt+1) * 500 * time.Millisecond)
	}
}

// scaleProxy is one proxy of a scale run.
type scaleProxy struct {
	name    string
	tp      *testnet.Topology
	d       *daemon
	started time.Time

	syncedIn   time.Duration // 0 until it programmed the list
	atSync     procUsage
	rssKB      []int64 // sampled after every proxy synced
	childMu    sync.Mutex
	childPeak  int64 // KB, the largest VmHWM seen of a child process
	childNames map[string]bool
}

// runScale runs the proxies of one mode against the populated API server
// and reports their memory.
func runScale(t *testing.T, e *env, kubeconfig string, n int, bin string, baselines []baseline, kpBin string) {
	mode := e.backend
	tps := map[string]*testnet.Topology{}
	for _, name := range []string{"kube-proxy", "proxykit"} {
		tps[name] = testnet.New(t, testnet.Options{Node1Pods: 3, Node2Pods: 2})
	}
	for _, b := range baselines {
		tps[b.name] = testnet.New(t, testnet.Options{Node1Pods: 3, Node2Pods: 2})
	}
	e.tp = tps["proxykit"]
	ensureScaleNodeAndProbe(e)
	probeSvc, err := e.cs.CoreV1().Services(testNS).Get(e.ctx, scaleProbe, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	probeDst := clusterIP(t, probeSvc, model.IPv4)
	want := float64(n + 1) // the scale Services and the probe

	api := strings.TrimPrefix(e.cluster.Host, "https://")
	kpTP := tps["kube-proxy"]
	startRelay(t, kpTP.Node1.NS, api, nil, api)
	metrics, healthz := freeAddr(t), freeAddr(t)
	config := withProfiling(t, writeKubeProxyConfig(t, mode, kubeconfig, metrics, healthz, e.tp.Node1))

	// One at a time, each against the populated API server with the
	// others idle or syncing: examples/proxy first (startDaemon waits
	// for its first sync, seconds), then the baselines, then kube-proxy,
	// whose first sync takes minutes.
	var proxies []*scaleProxy
	p := &scaleProxy{name: "proxykit", tp: e.tp, started: time.Now()}
	p.d = startDaemon(t, bin, p.tp.Node1.Path(), "--config="+config, "--netns="+p.tp.Node1.Path(), "-v=2")
	proxies = append(proxies, p)
	for _, b := range baselines {
		bm, bh := freeAddr(t), freeAddr(t)
		bconfig := withProfiling(t, writeKubeProxyConfig(t, mode, kubeconfig, bm, bh, e.tp.Node1))
		p := &scaleProxy{name: b.name, tp: tps[b.name], started: time.Now()}
		p.d = startDaemon(t, b.bin, p.tp.Node1.Path(), "--config="+bconfig, "--netns="+p.tp.Node1.Path(), "-v=2")
		proxies = append(proxies, p)
	}
	kp := &scaleProxy{name: "kube-proxy", tp: kpTP}
	kp.d, kp.started = launchKubeProxy(t, kpBin, kpTP.Node1, metrics, healthz, "--config="+config, "-v=2")
	proxies = append(proxies, kp)

	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		sampleChildren(proxies, stop)
	}()
	defer func() {
		close(stop)
		sampler.Wait()
	}()

	deadline := time.Now().Add(scaleSyncLimit)
	for {
		pending := 0
		for _, p := range proxies {
			if p.syncedIn > 0 {
				continue
			}
			if p.d.exited() {
				t.Fatalf("%s exited before it synced: %v; log:\n%s", p.name, p.d.err, tailFile(p.d.logPath, 60))
			}
			if !p.programmed(want, probeDst) {
				pending++
				continue
			}
			p.syncedIn = time.Since(p.started)
			p.atSync, _ = usage(p.d.cmd.Process.Pid)
			t.Logf("E2E-SCALE mode=%s proxy=%s programmed %d Services in %v: %v", mode, p.name, n+1, p.syncedIn.Round(100*time.Millisecond), p.atSync)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range proxies {
				if p.syncedIn == 0 {
					t.Errorf("%s did not program %d Services within %v; log:\n%s", p.name, n+1, scaleSyncLimit, tailFile(p.d.logPath, 30))
				}
			}
			t.FailNow()
		}
		time.Sleep(500 * time.Millisecond)
	}
	for end := time.Now().Add(scaleSettle); time.Now().Before(end); time.Sleep(scaleSample) {
		for _, p := range proxies {
			if u, err := usage(p.d.cmd.Process.Pid); err == nil {
				p.rssKB = append(p.rssKB, u.rssKB)
			}
		}
	}
	for _, p := range proxies {
		p.report(t, mode, n)
	}
}

// withProfiling adds enableProfiling to a KubeProxyConfiguration file, so
// that both proxies serve /debug/pprof on their metrics address.
func withProfiling(t *testing.T, path string) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("enableProfiling: true\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// ensureScaleNodeAndProbe creates, once, the Node node1 with node1's
// internal addresses (the same in every sandbox), the test's namespace and
// the probe Service with node1-pod1 as its endpoint.
func ensureScaleNodeAndProbe(e *env) {
	t := e.t
	t.Helper()
	if _, err := e.cs.CoreV1().Services(testNS).Get(e.ctx, scaleProbe, metav1.GetOptions{}); err == nil {
		return
	}
	s := &sideBySide{env: e}
	s.createObjects()
	s.createService(scaleProbe)
	s.setEndpoints(scaleProbe, model.IPv4, e.tp.Node1.Pods[0])
}

// programmed reports whether the proxy has completed a sync of the IPv4
// family (the Services' family: the IPv6 one syncs at once, with nothing
// to program) after receiving at least want Service and EndpointSlice
// events, and the probe Service answers from node1-pod1 through it. (The
// probe alone does not tell: examples/proxy's iptables mode writes a
// large first sync in several iptables-restore runs.)
func (p *scaleProxy) programmed(want float64, probeDst netip.AddrPort) bool {
	if v, err := metricSeries(p.d, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", `ip_family="IPv4"`); err != nil || v <= 0 {
		return false
	}
	for _, m := range []string{"kubeproxy_sync_proxy_rules_service_changes_total", "kubeproxy_sync_proxy_rules_endpoint_changes_total"} {
		if v, err := p.d.metric(m); err != nil || v < want {
			return false
		}
	}
	r := fromPod(p.tp).TCP(probeDst, probeTimeout)
	return r.Outcome == testnet.Answered && r.Server == p.tp.Node1.Pods[0].Name
}

// metricSeries returns the value of the series of a metric whose labels
// contain label (e.g. ip_family="IPv4").
func metricSeries(d *daemon, name, label string) (float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		l := s.Text()
		rest, ok := strings.CutPrefix(l, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if ok && strings.Contains(labels, label) {
			return strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no series %s{%s}", name, label)
}

// sampleChildren records, every 100 ms until stop, the peak resident
// memory (VmHWM) of the proxies' child processes (nft, iptables-restore).
func sampleChildren(proxies []*scaleProxy, stop chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		parents := map[int]*scaleProxy{}
		for _, p := range proxies {
			parents[p.d.cmd.Process.Pid] = p
		}
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil {
				continue
			}
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...
			lp, rp := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
			if lp < 0 || rp < lp {
				continue
			}
			f := strings.Fields(string(stat[rp+1:]))
			if len(f) < 2 {
				continue
			}
			ppid, _ := strconv.Atoi(f[1])
			p := parents[ppid]
			if p == nil {
				continue
			}
			u, err := usage(pid)
			if err != nil {
				continue
			}
			p.childMu.Lock()
			p.childPeak = max(p.childPeak, u.hwmKB)
			if p.childNames == nil {
				p.childNames = map[string]bool{}
			}
			p.childNames[string(stat[lp+1:rp])] = true
			p.childMu.Unlock()
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// report logs the proxy's figures: /proc now and at its sync, its Go heap
// before and after a forced collection, and its children's peak. The heap
// profile goes to EnvScaleProfiles when set.
func (p *scaleProxy) report(t *testing.T, mode string, n int) {
	t.Helper()
	u, err := usage(p.d.cmd.Process.Pid)
	if err != nil {
		t.Errorf("%s: %v", p.name, err)
	}
	mb := func(name string) string {
		v, err := p.d.metric(name)
		if err != nil {
			return "n/a"
		}
		return fmt.Sprintf("%.1fMB", v/(1<<20))
	}
	heapInuse, heapAlloc, goSys := mb("go_memstats_heap_inuse_bytes"), mb("go_memstats_heap_alloc_bytes"), mb("go_memstats_sys_bytes")
	profile := "not written"
	if err := p.heapProfile(mode); err != nil {
		profile = err.Error()
	} else if dir := os.Getenv(EnvScaleProfiles); dir != "" {
		profile = filepath.Join(dir, mode+"-"+p.name+".heap")
	}
	liveAlloc, liveInuse := mb("go_memstats_heap_alloc_bytes"), mb("go_memstats_heap_inuse_bytes")
	p.childMu.Lock()
	var children []string
	for c := range p.childNames {
		children = append(children, c)
	}
	slices.Sort(children)
	childPeak := p.childPeak
	p.childMu.Unlock()
	rss := slices.Sorted(slices.Values(p.rssKB))
	window := "n/a"
	if len(rss) > 0 {
		window = fmt.Sprintf("min=%.1fMB median=%.1fMB max=%.1fMB (%d samples)",
			float64(rss[0])/1024, float64(rss[len(rss)/2])/1024, float64(rss[len(rss)-1])/1024, len(rss))
	}
	t.Logf("E2E-SCALE mode=%s proxy=%s services=%d endpoints-per-slice=%d synced-in=%v | at sync: %v | VmRSS over the next %v: %s | then: %v | go heap: inuse=%s alloc=%s sys=%s; after GC: alloc=%s inuse=%s | children %v peak VmHWM=%.1fMB (sampled) | heap profile: %s",
		mode, p.name, n, scaleEndpoints, p.syncedIn.Round(100*time.Millisecond), p.atSync, scaleSettle, window, u,
		heapInuse, heapAlloc, goSys, liveAlloc, liveInuse, children, float64(childPeak)/1024, profile)
}

// heapProfile fetches /debug/pprof/heap?gc=1 (which collects garbage
// first) and writes it to EnvScaleProfiles when set.
func (p *scaleProxy) heapProfile(mode string) error {
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Get("http://" + p.d.metrics + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("heap profile: %s", resp.Status)
	}
	dir := os.Getenv(EnvScaleProfiles)
	if dir == "" {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, mode+"-"+p.name+".heap"))
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}
