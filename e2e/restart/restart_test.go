package restart

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
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

	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/internal/cgroup2"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// EnvScale sets the number of services (of [endpoints] endpoints each);
// default [defaultScale].
const EnvScale = "PROXYKIT_RESTART_SCALE"

// EnvCPUProfile, when set, is a directory where the new process of each
// backend writes a CPU profile of its start, up to its first sync
// (restart-<backend>-<services>.cpu.pprof, for go tool pprof with the
// test binary).
const EnvCPUProfile = "PROXYKIT_RESTART_CPUPROFILE"

// EnvIPTablesMode, when set ("legacy" or "nft"), is the iptables
// backend's flavour; by default the backend detects it (nft in a new
// namespace where iptables-nft is installed).
const EnvIPTablesMode = "PROXYKIT_RESTART_IPTABLES_MODE"

const (
	defaultScale = 5000
	endpoints    = 10
	// probed and echoed are how many services get real endpoints (node2's
	// pods) for the new connections and for the established ones.
	probed, echoed = 40, 8
	// probeRate is how many new connections per second the prober opens
	// (each in its own goroutine, so a slow one does not lower the rate).
	probeRate = 50
	// probeTimeout is how long a new connection may take to be answered
	// before it counts as failed; slowAnswer is the time past which an
	// answered one counts as slow (a lost SYN is retransmitted after 1 s).
	probeTimeout = 3 * time.Second
	slowAnswer   = 500 * time.Millisecond
	// settle is how long the prober goes on after the new process synced
	// (its first sync is the moment a rewrite would disturb traffic).
	settle = 2 * time.Second
)

// TestRestartAtScale: for each of nftables, iptables and eBPF (pinned), a
// proxier process programs node1 with the generated services; then it is
// SIGKILLed and a new one starts against the same source. Established
// connections must keep carrying data, new connections opened at ~50/s
// throughout must all be answered by the service's endpoints, and the
// kernel must hold what the services ask for once the new process synced.
// The new process must read the static source's objects from the cache
// the first left (static.Source.CacheDir), as a restarted daemon does.
// The time from the new process's start to its first successful sync is
// reported, not asserted (the target is < 2 s at 30,000 services
// when the kernel already matches).
func TestRestartAtScale(t *testing.T) {
	testnet.RequireRoot(t)
	n := defaultScale
	if v := os.Getenv(EnvScale); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < probed+echoed {
			t.Fatalf("%s=%q: want a number of services ≥ %d", EnvScale, v, probed+echoed)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The real endpoints are node2's pods, whose names and addresses are
	// the same in every topology of the default options: the first
	// backend's topology names them, the source is written once.
	var w *workload
	tmp := t.TempDir()
	src, cache := filepath.Join(tmp, "services.yaml"), filepath.Join(tmp, "cache")
	source := func(t *testing.T, pods []*testnet.Pod) *workload {
		if w != nil {
			return w
		}
		start := time.Now()
		nw := newWorkload(n, pods)
		if err := nw.writeSource(src); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d services × %d endpoints: source written in %v (%d MB)", n, endpoints, time.Since(start).Round(time.Millisecond), st.Size()>>20)
		w = nw
		return w
	}
	for _, b := range []string{"nftables", "iptables", "ebpf"} {
		t.Run(b, func(t *testing.T) {
			if b == "iptables" {
				testnet.RequireCommand(t, "iptables-restore")
			}
			r := &run{t: t, source: source, exe: exe, params: childParams{Backend: b, Source: src, SourceCache: cache, Services: n, Endpoints: endpoints}}
			if b == "iptables" {
				r.params.IPTablesMode = os.Getenv(EnvIPTablesMode)
			}
			r.restart()
		})
	}
}

// workload is the generated services, those of them with real endpoints,
// and the frontends the kernel must hold.
type workload struct {
	svcs []scale.Service
	// probe are the cluster IPs the prober connects to; echo those of the
	// echo services.
	probe, echo []netip.AddrPort
	// servers are the names of the pods behind them.
	servers []string
	want    map[string]proxier.Frontend
}

// newWorkload generates n services of [endpoints] endpoints (scale's);
// [probed] and [echoed] of them, spread over the range, have the pods as
// endpoints instead, on the first server port and the echo port.
func newWorkload(n int, pods []*testnet.Pod) *workload {
	w := &workload{svcs: scale.Services(n, endpoints), want: map[string]proxier.Frontend{}}
	var real []netip.Addr
	for _, p := range pods {
		real = append(real, p.IP(model.IPv4))
		w.servers = append(w.servers, p.Name)
	}
	step := n / (probed + echoed)
	echoAt := map[int]bool{}
	for k := range probed + echoed {
		i := k*step + step/2
		w.svcs[i].Endpoints = real
		w.svcs[i].EndpointNode = testnet.Node2Name
		dst := netip.AddrPortFrom(w.svcs[i].ClusterIP, scale.Port)
		if k%((probed+echoed)/echoed) == 0 {
			echoAt[i] = true
			w.echo = append(w.echo, dst)
		} else {
			w.probe = append(w.probe, dst)
		}
	}
	for i, s := range w.svcs {
		port := uint16(scale.TargetPort)
		if echoAt[i] {
			port = testnet.EchoPort
		}
		var eps []netip.AddrPort
		for _, a := range s.Endpoints {
			eps = append(eps, netip.AddrPortFrom(a, port))
		}
		f := proxier.Frontend{Addr: s.ClusterIP, Protocol: model.TCP, Port: scale.Port, Endpoints: eps}
		w.want[f.Key()] = f
		if s.NodePort != 0 {
			f.Addr, f.Port = netip.Addr{}, s.NodePort
			w.want[f.Key()] = f
		}
	}
	return w
}

// targetPort returns the target port of the endpoints of s.
func (w *workload) targetPort(s scale.Service) int32 {
	if slices.Contains(w.echo, netip.AddrPortFrom(s.ClusterIP, scale.Port)) {
		return int32(testnet.EchoPort)
	}
	return scale.TargetPort
}

// writeSource writes the Services and EndpointSlices as a multi-document
// YAML file for the static source.
func (w *workload) writeSource(path string) error {
	var buf bytes.Buffer
	for i, s := range w.svcs {
		svc, sl := s.Object(i), s.Slice(0)
		svc.APIVersion, svc.Kind = "v1", "Service"
		sl.APIVersion, sl.Kind = "discovery.k8s.io/v1", "EndpointSlice"
		port := w.targetPort(s)
		sl.Ports[0].Port = &port
		for _, o := range []any{svc, sl} {
			b, err := yaml.Marshal(o)
			if err != nil {
				return err
			}
			buf.WriteString("---\n")
			buf.Write(b)
		}
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// run is one backend's restart.
type run struct {
	t *testing.T
	// source returns the workload, writing the source file the first
	// time, with the real endpoints among pods.
	source func(t *testing.T, pods []*testnet.Pod) *workload
	w      *workload
	exe    string
	params childParams
	tn     *testnet.Topology
	client *testnet.Host
}

// restart builds the topology, starts the first proxier process, opens
// the established connections and the prober, kills the process, starts
// the second and checks connections, probes and the kernel.
func (r *run) restart() {
	t := r.t
	if r.params.Backend == "ebpf" {
		// The socket programs translate the sockets of a cgroup: this
		// process (probes and pods' servers) and its children enter one
		// of their own. Registered first, it is left last.
		if _, err := cgroup2.Mount(); err != nil {
			t.Skipf("the ebpf backend needs cgroup v2: %v", err)
		}
		cg, leave, err := cgroup2.Enter("proxykit-restart-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := leave(); err != nil {
				t.Error(err)
			}
		})
		r.params.Cgroup = cg
	}
	r.tn = testnet.New(t, testnet.Options{})
	r.w = r.source(t, r.tn.Node2.Pods)
	r.client = &r.tn.Node1.Pods[2].Host
	r.params.NetNS = r.tn.Node1.Path()
	if r.params.Backend == "ebpf" {
		r.params.PinPath = testnet.BPFFS(t)
		for _, p := range r.tn.Node1.Pods {
			r.params.PodNetNS = append(r.params.PodNetNS, p.Path())
		}
	}
	if r.params.Backend == "ebpf" {
		// The pinned programs and maps outlive the processes and the
		// namespaces (the other backends' state goes with node1's
		// namespace): removed after the processes are gone, before the
		// bpffs and the cgroup.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := r.params.config(nil)
			ec := c.EBPF
			ec.Config = c.Config
			if err := ebpf.Cleanup(ctx, ec); err != nil {
				t.Errorf("ebpf cleanup: %v", err)
			}
		})
	}

	first := r.start("first")
	rep, took := first.waitSynced(r.syncLimit())
	t.Logf("first process (empty kernel): synced %v after its start (New %.0f ms, source %.0f ms, first sync %.0f ms)",
		took.Round(time.Millisecond), rep.NewMS, rep.FeedMS, rep.SyncMS)

	conns := r.dialEcho()
	ctx, stopProbe := context.WithCancel(context.Background())
	defer stopProbe()
	pr := &prober{from: r.client, dsts: r.w.probe, want: r.w.servers}
	probing := pr.start(ctx)
	time.Sleep(time.Second) // probe the running dataplane first

	killed := time.Now()
	pr.mark(killed)
	first.kill()
	broken := r.echo(conns, "old process killed")
	if dir := os.Getenv(EnvCPUProfile); dir != "" {
		r.params.CPUProfile = filepath.Join(dir, fmt.Sprintf("restart-%s-%d.cpu.pprof", r.params.Backend, len(r.w.svcs)))
		t.Logf("the new process writes a CPU profile of its start to %s", r.params.CPUProfile)
	}
	second := r.start("second")
	rep, took = second.waitSynced(r.syncLimit())
	time.Sleep(settle)
	if strings.Contains(grep(second.logPath, "full sync"), "checked after the sync") {
		// The iptables backend adopted the chains before listing them:
		// the traffic goes on through that listing, and the test waits
		// for its verdict.
		listed := r.waitLog(second.logPath, "listed our chains", r.syncLimit())
		t.Logf("the new process's check of the adopted chains (probing went on through it):\n%s", listed)
		if !strings.Contains(listed, "leftOver=0 missing=0") || !strings.Contains(listed, "err=<nil>") {
			t.Errorf("the check of the adopted chains did not agree with them")
		}
	}
	stopProbe()
	<-probing
	broken += r.echo(conns, "new process synced")

	t.Logf("RESTART %s %d services × %d endpoints: new process synced %v after its start (New %.0f ms, source %.0f ms, first sync %.0f ms); "+
		"new connections: %d failed of %d (%d during the restart; %d slower than %v, slowest %v); established: %d of %d broken; load average %s",
		r.params.Backend, len(r.w.svcs), endpoints, took.Round(time.Millisecond), rep.NewMS, rep.FeedMS, rep.SyncMS,
		pr.failures, pr.probes, pr.during, pr.slow, slowAnswer, pr.slowest.Round(time.Millisecond), broken, len(conns), loadavg())
	t.Logf("the new process's source and first sync, as it logged them:\n%s\n%s", grep(second.logPath, "static source"), grep(second.logPath, "full sync"))
	if !strings.Contains(grep(second.logPath, "static source"), "read the decoded documents from the cache") {
		// The first process left them there (Source.CacheDir) for the
		// same bytes.
		t.Errorf("the new process did not read the static source's cache")
	}
	if pr.failures > 0 {
		t.Errorf("%d of %d new connections failed (%d of them from the kill to %v after the new process synced); first: %s",
			pr.failures, pr.probes, pr.during, settle, strings.Join(pr.examples, "; "))
	}
	if pr.during == 0 {
		t.Errorf("no probe ran between the kill and the new process's sync: the prober did not measure the restart")
	}
	if broken > 0 {
		t.Errorf("%d of %d established connections broke", broken, len(conns))
	}
	r.checkKernel()
}

// syncLimit bounds a process's time to its first sync: generous, it only
// keeps a stuck process from holding the test until its timeout.
func (r *run) syncLimit() time.Duration {
	return 2*time.Minute + time.Duration(len(r.w.svcs))*10*time.Millisecond
}

// dialEcho opens one connection per echo service from the client pod and
// checks that it carries data.
func (r *run) dialEcho() []*net.TCPConn {
	var conns []*net.TCPConn
	for _, dst := range r.w.echo {
		c, err := r.client.DialTCP(dst, 2*time.Second)
		if err != nil {
			r.t.Fatalf("connect to echo service %s: %v", dst, err)
		}
		r.t.Cleanup(func() { c.Close() })
		if err := testnet.Echo(c, "before", 2*time.Second); err != nil {
			r.t.Fatalf("echo service %s before the restart: %v", dst, err)
		}
		conns = append(conns, c)
	}
	return conns
}

// echo sends a line on every connection and counts those that do not
// echo it; a broken one is closed and left out of later rounds.
func (r *run) echo(conns []*net.TCPConn, when string) (broken int) {
	for i, c := range conns {
		if c == nil {
			continue
		}
		if err := testnet.Echo(c, strings.ReplaceAll(when, " ", "-"), 2*time.Second); err != nil {
			r.t.Logf("established connection to %s, %s: %v", c.RemoteAddr(), when, err)
			c.Close()
			conns[i] = nil
			broken++
		}
	}
	return broken
}

// checkKernel reads back what the backend programmed and compares it
// with the frontends every service asks for.
func (r *run) checkKernel() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	got, err := backends.Inspect(ctx, r.params.Backend, r.params.config(nil))
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	seen := map[string]bool{}
	var extra, wrong []string
	for _, f := range got[model.IPv4] {
		k := f.Key()
		want, ok := r.w.want[k]
		if !ok && f.Addr.IsValid() {
			// A node port read back per node address.
			k = proxier.Frontend{Protocol: f.Protocol, Port: f.Port}.Key()
			want, ok = r.w.want[k]
		}
		if !ok {
			extra = append(extra, f.Key())
			continue
		}
		seen[k] = true
		if d := want.Diff(f); d != "" {
			wrong = append(wrong, f.Key()+": "+d)
		}
	}
	var missing []string
	for k := range r.w.want {
		if !seen[k] {
			missing = append(missing, k)
		}
	}
	t.Logf("kernel read back in %v: %d frontends for the %d wanted; %d missing, %d extra, %d different",
		time.Since(start).Round(time.Millisecond), len(got[model.IPv4]), len(r.w.want), len(missing), len(extra), len(wrong))
	for what, l := range map[string][]string{"missing": missing, "extra": extra, "different": wrong} {
		if len(l) > 0 {
			slices.Sort(l)
			t.Errorf("%d frontends %s after the restart, e.g. %s", len(l), what, strings.Join(l[:min(5, len(l))], "; "))
		}
	}
}

// proc is one proxier process.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time
	lines   chan string
	done    chan struct{}
	err     error
}

// start starts a proxier process for r, stopped (SIGTERM, then SIGKILL)
// at the end of the test if still running.
func (r *run) start(name string) *proc {
	t := r.t
	params, err := json.Marshal(r.params)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, logPath: filepath.Join(t.TempDir(), name+".log"), lines: make(chan string, 4), done: make(chan struct{})}
	log, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(r.exe, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), envChild+"="+string(params))
	p.cmd.Stderr = log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		p.err = p.cmd.Wait()
		log.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.kill()
		}
		if t.Failed() {
			t.Logf("end of the %s process's log:\n%s", p.name, tail(p.logPath, 30))
		}
	})
	return p
}

// waitSynced waits for the process's report of its first sync and
// returns it with the time from the process's start to the report.
func (p *proc) waitSynced(limit time.Duration) (childReport, time.Duration) {
	p.t.Helper()
	select {
	case line := <-p.lines:
		took := time.Since(p.started)
		var rep childReport
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			p.t.Fatalf("%s process: %q: %v", p.name, line, err)
		}
		if rep.Unsupported != "" && p.name == "first" {
			p.t.Skipf("backend not supported by this kernel: %s", rep.Unsupported)
		}
		if rep.Unsupported != "" {
			// The first process ran on this kernel: a restarted one
			// that says otherwise failed to start, whatever it calls it.
			p.t.Fatalf("%s process, %v after its start: the backend says it is not supported, yet the first process ran it on this kernel: %s",
				p.name, took.Round(time.Millisecond), rep.Unsupported)
		}
		return rep, took
	case <-p.done:
		p.t.Fatalf("%s process exited before its first sync: %v; log:\n%s", p.name, p.err, tail(p.logPath, 30))
	case <-time.After(limit):
		p.t.Fatalf("%s process not synced after %v; log:\n%s", p.name, limit, tail(p.logPath, 30))
	}
	panic("unreachable")
}

// kill SIGKILLs the process and waits until it is gone.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// prober opens new connections from one host at probeRate, round robin
// over dsts, and counts those not answered by one of want.
type prober struct {
	from *testnet.Host
	dsts []netip.AddrPort
	want []string

	mu                       sync.Mutex
	since                    time.Time // the kill, once marked
	probes, failures, during int
	slow                     int
	slowest                  time.Duration
	examples                 []string
}

// start probes until ctx is done; the channel is closed once every probe
// has ended.
func (p *prober) start(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / probeRate)
		defer tick.Stop()
		for k := 0; ; k++ {
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-tick.C:
			}
			dst := p.dsts[k%len(p.dsts)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				at := time.Now()
				p.record(at, dst, p.from.TCP(dst, probeTimeout))
			}()
		}
	}()
	return done
}

// mark notes the kill: probes started from then on count in during.
func (p *prober) mark(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.since = t
}

func (p *prober) record(at time.Time, dst netip.AddrPort, r testnet.Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes++
	afterKill := !p.since.IsZero() && !at.Before(p.since)
	if afterKill {
		p.during++
	}
	if r.Outcome == testnet.Answered && slices.Contains(p.want, r.Server) {
		if r.Elapsed > slowAnswer {
			p.slow++
		}
		p.slowest = max(p.slowest, r.Elapsed)
		return
	}
	p.failures++
	if len(p.examples) < 5 {
		when := "before the kill"
		if afterKill {
			when = fmt.Sprintf("%v after the kill", at.Sub(p.since).Round(time.Millisecond))
		}
		p.examples = append(p.examples, fmt.Sprintf("%s (%s): %v", dst, when, r))
	}
}

// loadavg returns the first three fields of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// grep returns the lines of the file at path that hold s.
func grep(path, s string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// waitLog waits up to limit for a line holding s in the log at path, and
// returns the lines holding it ("" if none came).
func (r *run) waitLog(path, s string, limit time.Duration) string {
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		if l := grep(path, s); l != "" || time.Now().After(deadline) {
			return l
		}
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
