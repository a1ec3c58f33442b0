package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testcluster"
	"github.com/proxykit/proxykit/internal/testnet"
)

// The real kube-proxy of TestKubeProxySideBySide: upstream's cmd/kube-proxy
// at testcluster.KubernetesVersion, built by hack/kubeproxy/build.sh into
// $PROXYKIT_CACHE (default /var/cache/proxykit) as kube-proxy-<version>.
const (
	kubeProxyBuildScript = "hack/kubeproxy/build.sh"
	// EnvKubeProxy names a kube-proxy binary to use instead of the one in
	// the cache.
	EnvKubeProxy = "PROXYKIT_KUBE_PROXY"
)

// kubeProxyBinary returns the path of the real kube-proxy, or skips the
// test naming the build script (fails it when CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1).
func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv(EnvKubeProxy)
	if p == "" {
		cache := os.Getenv(testcluster.EnvCache)
		if cache == "" {
			cache = testcluster.DefaultCache
		}
		p = filepath.Join(cache, "kube-proxy-"+testcluster.KubernetesVersion)
	}
	fi, err := os.Stat(p)
	if err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
		err = fmt.Errorf("%s is not an executable file", p)
	}
	if err != nil {
		msg := fmt.Sprintf("requires kube-proxy %s: %v; run %s (builds it into $%s, default %s)",
			testcluster.KubernetesVersion, err, kubeProxyBuildScript, testcluster.EnvCache, testcluster.DefaultCache)
		if testnet.Mandatory() {
			t.Fatalf("%s (a failure, not a skip, because %s=true or %s=1)", msg, testnet.EnvCI, testnet.EnvRequirePrivileged)
		}
		t.Skipf("%s (set %s=1 to make this a failure)", msg, testnet.EnvRequirePrivileged)
	}
	return p
}

// kubeProxyTools are the programs kube-proxy runs in the iptables and
// nftables modes. Its PATH holds only these: `modprobe -va ip_vs`, which
// its nftables mode runs to clean up IPVS leftovers, would load a module
// into the host's kernel.
var kubeProxyTools = []string{"nft", "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

// kubeProxyPath returns a directory of symbolic links to kubeProxyTools,
// for kube-proxy's PATH.
func kubeProxyPath(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range kubeProxyTools {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("kube-proxy needs %s: %v", name, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startKubeProxy starts the real kube-proxy inside node's namespace (it
// programs the namespace it runs in; the process is forked from a thread
// that entered it) with args, and stops it in t.Cleanup. metrics and
// healthz are the addresses of its servers inside the namespace; the
// returned daemon reaches them through relays on the host's loopback, so
// that its methods (metric, histogramQuantiles, get) work as for
// examples/proxy. It waits until kube-proxy has synced once.
func startKubeProxy(t *testing.T, bin string, node *testnet.Node, metrics, healthz string, args ...string) *daemon {
	t.Helper()
	d, start := launchKubeProxy(t, bin, node, metrics, healthz, args...)
	for deadline := time.Now().Add(60 * time.Second); !d.synced(); time.Sleep(50 * time.Millisecond) {
		if d.exited() || time.Now().After(deadline) {
			t.Fatalf("kube-proxy did not sync (exit: %v); log:\n%s", d.err, tailFile(d.logPath, 60))
		}
	}
	t.Logf("kube-proxy %s started in %s and synced in %v", strings.Join(args, " "), node.Path(), time.Since(start).Round(time.Millisecond))
	return d
}

// launchKubeProxy is startKubeProxy without the wait for the first sync
// (which takes minutes with 10,000 Services: TestInformerMemoryAtScale
// waits itself); it returns the daemon and when it was started.
func launchKubeProxy(t *testing.T, bin string, node *testnet.Node, metrics, healthz string, args ...string) (*daemon, time.Time) {
	t.Helper()
	if !strings.HasPrefix(node.Path(), testnet.NetNSDir+"/pk-") || sameNetNS(t, node.Path(), "/proc/self/ns/net") {
		t.Fatalf("refusing to start kube-proxy: %s is not a sandbox namespace", node.Path())
	}
	d := &daemon{logPath: filepath.Join(t.TempDir(), "kube-proxy.log"), done: make(chan struct{})}
	d.metrics = startRelay(t, nil, "127.0.0.1:0", node.NS, metrics)
	d.healthz = startRelay(t, nil, "127.0.0.1:0", node.NS, healthz)
	log, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = []string{"PATH=" + kubeProxyPath(t)}
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	start := time.Now()
	if err := node.Do(d.cmd.Start); err != nil {
		log.Close()
		t.Fatalf("start kube-proxy in %s: %v", node.Path(), err)
	}
	go func() {
		d.err = d.cmd.Wait()
		log.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		if err := stopKubeProxy(d); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("end of kube-proxy's log %s:\n%s", d.logPath, tailFile(d.logPath, 60))
		}
	})
	return d, start
}

// stopKubeProxy sends SIGTERM, which kube-proxy does not handle: being
// killed by it is the clean exit.
func stopKubeProxy(d *daemon) error {
	err := d.stop()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("kube-proxy: %w", err)
	}
	return nil
}

// sameNetNS reports whether two namespace files are the same namespace.
func sameNetNS(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev
}

// relay copies TCP connections accepted on a listener in one network
// namespace to an address dialled from another, in user space: a process
// inside a sandbox reaches the API server on the host's loopback (and the
// test reaches the process's servers on the sandbox's loopback) without
// any link between the namespaces.
type relay struct {
	l    net.Listener
	from *testnet.NS // where l listens; nil for the host's namespace
	to   *testnet.NS // where dst is dialled; nil for the host's namespace
	dst  string

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// startRelay listens on addr in from (nil: the test's own namespace),
// relays every connection to dst dialled in to (nil: the test's own
// namespace), closes everything in t.Cleanup (the relay's sockets must not
// outlive a sandbox's teardown) and returns the address it listens on.
func startRelay(t *testing.T, from *testnet.NS, addr string, to *testnet.NS, dst string) string {
	t.Helper()
	r := &relay{from: from, to: to, dst: dst, conns: map[net.Conn]bool{}}
	listen := func() (err error) {
		r.l, err = net.Listen("tcp", addr)
		return err
	}
	var err error
	if from != nil {
		err = from.Do(listen) // a socket keeps the namespace it was made in
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatalf("relay to %s: %v", dst, err)
	}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r.l.Addr().String()
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			return
		}
		r.wg.Add(1)
		go r.serve(c)
	}
}

// track records c to be closed with the relay; false (and c closed) when
// the relay is closed already.
func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = true
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

// serve dials dst for the accepted connection c and copies both ways
// until either side closes.
func (r *relay) serve(c net.Conn) {
	defer r.wg.Done()
	defer r.untrack(c)
	var u net.Conn
	dial := func() (err error) {
		u, err = net.DialTimeout("tcp", r.dst, 5*time.Second)
		return err
	}
	var err error
	if r.to != nil {
		err = r.to.Do(dial)
	} else {
		err = dial()
	}
	if err != nil || !r.track(u) {
		return
	}
	defer r.untrack(u)
	done := make(chan struct{})
	go func() {
		io.Copy(u, c)
		u.Close()
		close(done)
	}()
	io.Copy(c, u)
	c.Close()
	<-done
}

// close stops accepting, closes every relayed connection and waits for
// the relay's goroutines.
func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	r.l.Close()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// procUsage is what /proc says of a process: resident memory now and at
// its peak, and the CPU time it used.
type procUsage struct {
	rssKB, hwmKB int64
	cpu          time.Duration
}

func (u procUsage) String() string {
	return fmt.Sprintf("VmRSS=%.1fMB VmHWM=%.1fMB cpu=%v", float64(u.rssKB)/1024, float64(u.hwmKB)/1024, u.cpu.Round(10*time.Millisecond))
}

// usage reads VmRSS and VmHWM from /proc/PID/status and utime+stime from
// /proc/PID/stat.
func usage(pid int) (procUsage, error) {
	var u procUsage
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			u.rssKB = n
		case "VmHWM":
			u.hwmKB = n
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the command name (in parentheses): utime and stime
	// are the 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
	_, rest, _ := strings.Cut(string(stat), ") ")
	if f := strings.Fields(rest); len(f) > 12 {
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		u.cpu = time.Duration(ut+st) * 10 * time.Millisecond
	}
	return u, nil
}

// hostGlobals are the host-wide settings a service proxy could change:
// conntrack's table size and timeouts (nf_conntrack_max and hashsize are
// global, the others per namespace) and the host namespace's forwarding
// and loopback routing. A proxy running in, or programming, a sandbox
// namespace must leave the host's alone.
var hostGlobals = []string{
	"/proc/sys/net/netfilter/nf_conntrack_max",
	"/sys/module/nf_conntrack/parameters/hashsize",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
	"/proc/sys/net/ipv4/ip_forward",
	"/proc/sys/net/ipv4/conf/all/route_localnet",
}

// hostState is a snapshot of the host's settings (hostGlobals) and of the
// lines of its rule listings that name kube-proxy's tables and chains.
type hostState struct {
	settings map[string]string
	kube     map[string]bool
}

// snapshotHost reads the host's state; it runs on the test's own threads,
// which are in the host's namespace (/proc/sys/net is the reader's).
func snapshotHost() hostState {
	h := hostState{settings: map[string]string{}, kube: map[string]bool{}}
	for _, p := range hostGlobals {
		if b, err := os.ReadFile(p); err == nil {
			h.settings[p] = strings.TrimSpace(string(b))
		}
	}
	for _, cmd := range hostListings {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			continue
		}
		b, _ := exec.Command(cmd[0], cmd[1:]...).Output()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(l), "kube") {
				h.kube[cmd[0]+": "+counters.ReplaceAllString(l, "")] = true
			}
		}
	}
	return h
}

// check fails the test if a setting changed or a kube line appeared since
// h was taken.
func (h hostState) check(t *testing.T) {
	t.Helper()
	now := snapshotHost()
	for _, p := range hostGlobals {
		if now.settings[p] != h.settings[p] {
			t.Errorf("the host's %s changed during the test: %q, was %q", p, now.settings[p], h.settings[p])
		}
	}
	var gained []string
	for l := range now.kube {
		if !h.kube[l] {
			gained = append(gained, l)
		}
	}
	slices.Sort(gained)
	for _, l := range gained {
		t.Errorf("the host network namespace gained %q during the test", l)
	}
}
