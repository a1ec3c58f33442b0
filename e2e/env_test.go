package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/internal/testcluster"
	"github.com/proxykit/proxykit/internal/testnet"
)

// Where the daemon and its manifest live, relative to this package.
const (
	daemonPkg = "github.com/proxykit/proxykit/examples/proxy"
	manifest  = "../examples/proxy/deploy/daemonset.yaml"
)

// testNS is the Kubernetes namespace of the test's objects.
const testNS = "e2e"

// EnvBackends lists the backends to test, comma-separated; default: those
// of defaultBackends that backends.Names() has.
const EnvBackends = "PROXYKIT_E2E_BACKENDS"

var defaultBackends = []string{"nftables", "iptables"}

// forEachBackend runs f as a subtest per backend under test.
func forEachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	names := defaultBackends
	if v := os.Getenv(EnvBackends); v != "" {
		names = strings.Split(v, ",")
	}
	ran := false
	for _, b := range names {
		b = strings.TrimSpace(b)
		if !slices.Contains(backends.Names(), b) {
			if os.Getenv(EnvBackends) != "" {
				t.Errorf("backend %q from %s is not registered (have %v)", b, EnvBackends, backends.Names())
			}
			continue
		}
		ran = true
		t.Run(b, func(t *testing.T) { f(t, b) })
	}
	if !ran {
		t.Fatalf("no backend to test: none of %v registered (have %v)", names, backends.Names())
	}
}

// env is one end-to-end setup: a control plane, a sandbox and the daemon
// programming node1 for one backend.
type env struct {
	t       *testing.T
	backend string
	cluster *testcluster.Cluster
	cs      kubernetes.Interface
	tp      *testnet.Topology
	proxy   *daemon
	ctx     context.Context
}

// envOptions shape an env.
type envOptions struct {
	// minSyncPeriod is the daemon's --min-sync-period; zero keeps its
	// default (1s).
	minSyncPeriod time.Duration
}

// newEnv sets up an env: it skips without root or without the control
// plane binaries.
func newEnv(t *testing.T, backend string, opts envOptions) *env {
	t.Helper()
	testcluster.RequireBinaries(t)
	testnet.RequireRoot(t)
	bin := proxyBinary(t)
	host := hostTables()

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, backend: backend, ctx: ctx}
	e.cluster = testcluster.Start(t, testcluster.Options{})
	e.cs = e.cluster.Client(t)

	kubeconfig := e.cluster.ManifestKubeconfig(t, manifest)
	e.checkNotAdmin(kubeconfig)

	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testnet.Node1Name, Labels: map[string]string{
		v1.LabelHostname: testnet.Node1Name, v1.LabelTopologyZone: "zone-a", v1.LabelOSStable: "linux",
	}}}
	if _, err := e.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	e.tp = testnet.New(t, testnet.Options{Node1Pods: 3, Node2Pods: 2})
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--proxy-mode=" + backend,
		"--hostname-override=" + testnet.Node1Name,
		"--netns=" + e.tp.Node1.Path(),
		"--cluster-cidr=" + testnet.PodNetworkIPv4.String() + "," + testnet.PodNetworkIPv6.String(),
		// kube-proxy's validation refuses port 0: free ports, picked
		// now (the daemon logs what it serves on).
		"--metrics-bind-address=" + freeAddr(t),
		"--healthz-bind-address=" + freeAddr(t),
		// Node ports on every address, as the tests probe them on
		// node1's address toward the client (kube-proxy's nftables
		// mode defaults to the primary address only).
		"--nodeport-addresses=0.0.0.0/0,::/0",
		// nf_conntrack_max is the host's: a daemon programming another
		// namespace leaves it alone, as kube-proxy's 0 means.
		"--conntrack-max-per-core=0",
		"-v=4", // every sync in the log, shown when the test fails
	}
	if opts.minSyncPeriod > 0 {
		flag := "--iptables-min-sync-period=" // kube-proxy's flag for every mode but ipvs
		if backend == "ipvs" {
			flag = "--ipvs-min-sync-period="
		}
		args = append(args, flag+opts.minSyncPeriod.String())
	}
	e.proxy = startDaemon(t, bin, e.tp.Node1.Path(), args...)
	t.Cleanup(func() { host.check(t) })
	return e
}

// freeAddr returns a loopback address with a TCP port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// checkNotAdmin checks that the daemon's identity can read what it needs
// and cannot write: the RBAC of the manifest, not an admin token.
func (e *env) checkNotAdmin(kubeconfig string) {
	e.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		e.t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.DiscoveryV1().EndpointSlices("").List(e.ctx, metav1.ListOptions{Limit: 1}); err != nil {
		e.t.Fatalf("the daemon's service account cannot list EndpointSlices: %v", err)
	}
	if err := cs.CoreV1().Services("default").Delete(e.ctx, "kubernetes", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		e.t.Fatal("the daemon's service account may delete Services: it should not be an admin")
	}
}

// daemon is a running examples/proxy process.
type daemon struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	healthz string // host:port
	metrics string // host:port
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildTime time.Duration
)

// proxyBinary builds examples/proxy once per test binary.
func proxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		start := time.Now()
		if buildDir, buildErr = os.MkdirTemp("", "proxykit-e2e-"); buildErr != nil {
			return
		}
		out, err := exec.Command(goTool(), "build", "-o", filepath.Join(buildDir, "proxy"), daemonPkg).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", daemonPkg, err, out)
		}
		buildTime = time.Since(start)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	t.Logf("examples/proxy built in %v", buildTime.Round(time.Millisecond))
	return filepath.Join(buildDir, "proxy")
}

// goTool returns the go command: in PATH, else in $GOROOT/bin.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if r := os.Getenv("GOROOT"); r != "" {
		return filepath.Join(r, "bin", "go")
	}
	return "/usr/local/go/bin/go"
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var servingRE = regexp.MustCompile(`msg=serving server=(\w+) address=(\S+)`)

// startDaemon starts the daemon after checking that netns, the namespace
// it will program, is not the test process's own (the host's), and stops
// it (SIGTERM) in t.Cleanup, before the sandbox is torn down. It waits
// until the daemon serves /healthz and has synced once.
func startDaemon(t *testing.T, bin, netns string, args ...string) *daemon {
	t.Helper()
	if !slices.Contains(args, "--netns="+netns) || !strings.HasPrefix(netns, testnet.NetNSDir+"/pk-") {
		t.Fatalf("refusing to start the daemon: --netns=%s is not a sandbox namespace", netns)
	}
	var own, target syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &own); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(netns, &target); err != nil {
		t.Fatal(err)
	}
	if own.Ino == target.Ino && own.Dev == target.Dev {
		t.Fatalf("refusing to start the daemon: %s is the host's own network namespace", netns)
	}

	d := &daemon{logPath: filepath.Join(t.TempDir(), "proxy.log"), done: make(chan struct{})}
	log, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	start := time.Now()
	if err := d.cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		log.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("end of the daemon's log %s:\n%s", d.logPath, tailFile(d.logPath, 60))
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for d.healthz == "" || d.metrics == "" {
		if d.exited() || time.Now().After(deadline) {
			t.Fatalf("the daemon did not start (exit: %v); log:\n%s", d.err, tailFile(d.logPath, 60))
		}
		time.Sleep(20 * time.Millisecond)
		for _, m := range servingRE.FindAllStringSubmatch(readFile(d.logPath), -1) {
			switch m[1] {
			case "healthz":
				d.healthz = m[2]
			case "metrics":
				d.metrics = m[2]
			}
		}
	}
	for !d.synced() {
		if d.exited() || time.Now().After(deadline) {
			t.Fatalf("the daemon did not sync (exit: %v); log:\n%s", d.err, tailFile(d.logPath, 60))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("daemon %s started and synced in %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return d
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// get requests path from the daemon's health server and returns the
// status code (0 when it does not answer).
func (d *daemon) get(path string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + d.healthz + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// synced reports whether the daemon has completed a sync, from its
// metrics.
func (d *daemon) synced() bool {
	v, err := d.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
	return err == nil && v > 0
}

// metric returns the largest value among the series of a metric (e.g.
// the ip_family series of a timestamp).
func (d *daemon) metric(name string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	re := regexp.MustCompile(`^` + name + `(?:\{[^}]*\})? (\S+)$`)
	s := bufio.NewScanner(resp.Body)
	found, v := false, 0.0
	for s.Scan() {
		if m := re.FindStringSubmatch(s.Text()); m != nil {
			x, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return 0, err
			}
			if !found || x > v {
				found, v = true, x
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("no metric %s", name)
	}
	return v, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() error {
	if d.exited() {
		return d.exitErr()
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return d.exitErr()
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		return errors.New("the daemon did not stop within 20 s of SIGTERM; killed")
	}
}

func (d *daemon) exitErr() error {
	if d.err != nil {
		return fmt.Errorf("the daemon exited: %w", d.err)
	}
	return nil
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func tailFile(path string, n int) string {
	lines := strings.Split(strings.TrimRight(readFile(path), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// hostSnapshot holds the lines of the host namespace's nftables and
// iptables listings that name proxykit, before the test: the daemon must
// add none (it programs node1's namespace, never the host's).
type hostSnapshot map[string]bool

// hostListings are read-only listings of the host namespace's rules.
var hostListings = [][]string{{"nft", "list", "tables"}, {"iptables-save"}, {"ip6tables-save"}}

// hostTables lists the host namespace's rules that name proxykit, with the
// tools installed.
func hostTables() hostSnapshot {
	snap := hostSnapshot{}
	for _, l := range hostProxykitLines() {
		snap[l] = true
	}
	return snap
}

func hostProxykitLines() []string {
	var out []string
	for _, cmd := range hostListings {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			continue
		}
		b, err := exec.Command(cmd[0], cmd[1:]...).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(l), "proxykit") {
				out = append(out, cmd[0]+": "+counters.ReplaceAllString(l, ""))
			}
		}
	}
	return out
}

// check fails the test if a line naming proxykit appeared in the host
// namespace's rules.
func (h hostSnapshot) check(t *testing.T) {
	for _, l := range hostProxykitLines() {
		if !h[l] {
			t.Errorf("the host network namespace gained %q during the test", l)
		}
	}
}

// ip parses an address the API server returned.
func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// histogramQuantiles summarizes a histogram of the daemon's metrics, its
// series (e.g. one per ip_family) added up: count, mean, and the bucket
// bounds holding the median and the 99th percentile.
func (d *daemon) histogramQuantiles(name string) (string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	type bucket struct {
		le    string
		count float64
	}
	var buckets []bucket
	var sum, count float64
	bucketRE := regexp.MustCompile(`^` + name + `_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} (\S+)$`)
	totalRE := regexp.MustCompile(`^` + name + `_(sum|count)(?:\{[^}]*\})? (\S+)$`)
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		l := s.Text()
		if m := bucketRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.ParseFloat(m[2], 64)
			if i := slices.IndexFunc(buckets, func(b bucket) bool { return b.le == m[1] }); i >= 0 {
				buckets[i].count += n
			} else {
				buckets = append(buckets, bucket{m[1], n})
			}
		} else if m := totalRE.FindStringSubmatch(l); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			if m[1] == "sum" {
				sum += v
			} else {
				count += v
			}
		}
	}
	if count == 0 {
		return "", fmt.Errorf("no observations of %s", name)
	}
	q := func(p float64) string {
		for _, b := range buckets {
			if b.count >= p*count {
				return b.le + "s"
			}
		}
		return "+Inf"
	}
	mean := time.Duration(sum / count * float64(time.Second)).Round(100 * time.Microsecond)
	return fmt.Sprintf("count=%d mean=%v p50<=%s p99<=%s", int(count), mean, q(0.5), q(0.99)), nil
}
