package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/proxykit/proxykit/internal/cgroup2"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
)

// Case is the outcome of one dataplane at one size.
type Case struct {
	// Kind is "backend" (a proxykit proxier) or "reference" (a
	// kube-proxy layout loaded with its tool).
	Kind string `json:"kind"`
	// Name is the backend or reference name; Label what the report
	// shows (with the iptables flavour).
	Name  string `json:"name"`
	Label string `json:"label"`
	Size  Size   `json:"size"`
	// Status is "ok", "cut" (left out to stay within the limits),
	// "unsupported" (this kernel cannot run it) or "error".
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// SyncSeconds is the first full sync: for a backend from Run until
	// Flush returned, with every object delivered before; for a
	// reference the loader's run on the whole rule set.
	SyncSeconds float64 `json:"sync_seconds,omitempty"`
	// SyncCPUSeconds is the CPU time of the proxier process in its
	// first sync (backends): less moved by the machine's other load.
	SyncCPUSeconds float64 `json:"sync_cpu_seconds,omitempty"`
	// FeedSeconds is how long delivering the objects to the proxier
	// took (backends).
	FeedSeconds float64 `json:"feed_seconds,omitempty"`
	// PeakRSSMB is the peak resident set of the proxier process
	// (VmHWM), or of the loader process for a reference.
	PeakRSSMB float64 `json:"peak_rss_mb,omitempty"`
	// RuleSetMB is the size of a reference's rule set.
	RuleSetMB float64 `json:"ruleset_mb,omitempty"`
	// Change is the latency of one endpoint change, in milliseconds.
	Change Stats `json:"change_ms"`
	// Connect and FirstByte are TCP connect and connect-to-first-byte
	// times through the cluster IP, in microseconds.
	Connect   Stats `json:"connect_us"`
	FirstByte Stats `json:"first_byte_us"`
	// ElapsedSeconds is the whole case, set-up and teardown included.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
}

func (c *Case) ok() bool { return c.Status == "ok" }

// Stats summarizes samples.
type Stats struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// stats summarizes ns, nanoseconds, in units of unit nanoseconds.
func stats(ns []int64, unit float64) Stats {
	if len(ns) == 0 {
		return Stats{}
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(0, min(len(s)-1, i))]) / unit
	}
	return Stats{N: len(s), Median: q(0.5), P99: q(0.99), Min: float64(s[0]) / unit, Max: float64(s[len(s)-1]) / unit}
}

// Report is a whole run.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Command  string    `json:"command"`
	Machine  Machine   `json:"machine"`
	Options  struct {
		Changes     int           `json:"changes"`
		ChangesTime time.Duration `json:"changes_time"`
		Connects    int           `json:"connects"`
		TimeLimit   time.Duration `json:"time_limit"`
		CaseLimit   time.Duration `json:"case_limit"`
		MaxServices int           `json:"max_services"`
	} `json:"options"`
	Cases []*Case `json:"cases"`
}

// runner runs the cases of one run.
type runner struct {
	o        Options
	exe      string
	start    time.Time
	deadline time.Time
	// iptFlavour is the host's iptables flavour, "nft" or "legacy".
	iptFlavour string
	cgroup2    string // cgroup v2 mount, "" if none
}

func run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	r := &runner{o: o, exe: exe, start: time.Now()}
	r.deadline = r.start.Add(o.TimeLimit)
	r.iptFlavour = hostIPTablesFlavour()
	r.cgroup2, _ = cgroup2.Mount()
	rep := &Report{Started: r.start, Command: o.Command, Machine: describeMachine()}
	rep.Options.Changes, rep.Options.ChangesTime, rep.Options.Connects = o.Changes, o.ChangesTime, o.Connects
	rep.Options.TimeLimit, rep.Options.CaseLimit, rep.Options.MaxServices = o.TimeLimit, o.CaseLimit, o.MaxServices

	sizes := slices.Clone(o.Sizes)
	slices.SortStableFunc(sizes, func(a, b Size) int { return int(a.cost() - b.cost()) })
	// Size by size, every dataplane at one size before the next size,
	// so that when time runs short the largest sizes are cut and every
	// size that ran compares all dataplanes. A dataplane whose first
	// sync is predicted (from its smaller sizes) to be too slow is cut
	// on its own.
	type series struct {
		kind, name  string
		done        []*Case
		unsupported string
	}
	var all []*series
	for _, b := range o.Backends {
		all = append(all, &series{kind: "backend", name: b})
	}
	for _, ref := range o.References {
		all = append(all, &series{kind: "reference", name: ref})
	}
	for _, sz := range sizes {
		for _, s := range all {
			c := &Case{Kind: s.kind, Name: s.name, Label: r.label(s.name), Size: sz}
			rep.Cases = append(rep.Cases, c)
			switch {
			case ctx.Err() != nil:
				c.Status, c.Reason = "cut", "interrupted"
			case s.unsupported != "":
				c.Status, c.Reason = "unsupported", s.unsupported
			case sz.Services > o.MaxServices:
				c.Status, c.Reason = "cut", fmt.Sprintf("more than --max-services=%d", o.MaxServices)
			default:
				if reason := r.cut(s.done, sz); reason != "" {
					c.Status, c.Reason = "cut", reason
					break
				}
				start := time.Now()
				r.logf("%s %s ...", c.Label, sz)
				if s.kind == "backend" {
					r.backendCase(ctx, c)
				} else {
					r.referenceCase(ctx, c)
				}
				c.ElapsedSeconds = time.Since(start).Seconds()
				if c.Status == "unsupported" {
					s.unsupported = c.Reason
				}
				if c.ok() {
					s.done = append(s.done, c)
				}
			}
			r.logf("%s %s: %s", c.Label, sz, c.summary())
		}
	}
	rep.Finished = time.Now()
	if ctx.Err() != nil {
		// Interrupted: keep the report of what was measured, but do not
		// overwrite the committed one.
		return rep, ctx.Err()
	}
	rep.Machine.LoadEnd = loadAvg()
	rep.Machine.Note = o.Note
	return rep, write(rep, o)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, "[%4ds] %s\n", int(time.Since(r.start).Seconds()), fmt.Sprintf(format, args...))
}

// label is a dataplane's name in the report.
func (r *runner) label(name string) string {
	switch name {
	case "iptables":
		return "iptables (" + r.iptFlavour + ")"
	case "iptables-nft":
		return "iptables (nft)"
	case "iptables-legacy":
		return "iptables (legacy)"
	case "ebpf":
		return "ebpf (+ nftables north-south)"
	case "ebpf-tc", "ebpf-xdp":
		return "ebpf (+ " + strings.TrimPrefix(name, "ebpf-") + " north-south)"
	case "ebpf-socket":
		return "ebpf (socket only)"
	case "ebpf-maglev":
		return "ebpf (socket only, Maglev)"
	case refNFT:
		return "kube-proxy nftables (nft -f)"
	case refIPTables:
		return "kube-proxy iptables, " + r.iptFlavour + " (iptables-restore)"
	case refIPTablesNFT:
		return "kube-proxy iptables, nft (iptables-nft-restore)"
	case refIPTablesLegacy:
		return "kube-proxy iptables, legacy (iptables-legacy-restore)"
	}
	return name
}

func (c *Case) summary() string {
	switch c.Status {
	case "ok":
		cpu := ""
		if c.Kind == "backend" {
			cpu = fmt.Sprintf(" (CPU %.3fs)", c.SyncCPUSeconds)
		}
		return fmt.Sprintf("sync %.3fs%s, peak RSS %.0f MB, change %.2f/%.2f ms (n=%d), connect %.0f/%.0f µs (n=%d), %.0fs in all",
			c.SyncSeconds, cpu, c.PeakRSSMB, c.Change.Median, c.Change.P99, c.Change.N, c.Connect.Median, c.Connect.P99, c.Connect.N, c.ElapsedSeconds)
	case "":
		return "?"
	}
	return c.Status + ": " + c.Reason
}

// predict estimates the first sync of size sz from the sizes measured
// before: a power law through the last two (exponent between 1 and 2.5),
// linear from one. Zero when nothing was measured.
func predict(done []*Case, sz Size) float64 {
	if len(done) == 0 {
		return 0
	}
	last := done[len(done)-1]
	k := 1.0
	if len(done) >= 2 {
		prev := done[len(done)-2]
		if last.Size.cost() > prev.Size.cost() && prev.SyncSeconds > 0 && last.SyncSeconds > 0 {
			k = math.Log(last.SyncSeconds/prev.SyncSeconds) / math.Log(last.Size.cost()/prev.Size.cost())
		}
	}
	k = min(2.5, max(1, k))
	return last.SyncSeconds * math.Pow(sz.cost()/last.Size.cost(), k)
}

// cut says why a case must be left out to stay within the limits, or "".
func (r *runner) cut(done []*Case, sz Size) string {
	p := predict(done, sz)
	if p > r.o.CaseLimit.Seconds() {
		return fmt.Sprintf("first sync predicted at %.0f s from the smaller sizes, over --case-limit=%v", p, r.o.CaseLimit)
	}
	// The case's whole cost: the sync, the object feed or rule set
	// generation and the teardown (each about as long again), the
	// changes and the connections, the set-up.
	need := 3*p + r.o.ChangesTime.Seconds() + 10
	if left := time.Until(r.deadline).Seconds(); need > left {
		return fmt.Sprintf("about %.0f s needed, %.0f s left of --time-limit=%v", need, max(0, left), r.o.TimeLimit)
	}
	return ""
}

// caseContext bounds one case: the run's deadline, and a generous
// multiple of the case limit.
func (r *runner) caseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.deadline
	if hard := time.Now().Add(3*r.o.CaseLimit + 2*r.o.ChangesTime + time.Minute); hard.Before(d) {
		d = hard
	}
	return context.WithDeadline(ctx, d)
}

// fail records err as the case's outcome: a cut when the case ran out of
// time, an error otherwise.
func (r *runner) fail(ctx, cctx context.Context, c *Case, err error) {
	switch {
	case ctx.Err() != nil:
		c.Status, c.Reason = "cut", "interrupted"
	case cctx.Err() != nil && !time.Now().Before(r.deadline):
		c.Status, c.Reason = "cut", fmt.Sprintf("stopped at --time-limit=%v", r.o.TimeLimit)
	case cctx.Err() != nil:
		c.Status, c.Reason = "cut", "stopped: ran far past --case-limit"
	default:
		c.Status, c.Reason = "error", oneLine(err.Error())
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

// topology builds the namespaces of a case: node1 (the proxier's), three
// pods behind it (two servers of the measured service and the client),
// node2, the outside client and the uplink.
func (r *runner) topology() (*testnet.Topology, error) {
	return testnet.Build(testnet.Options{Node1Pods: 3, Node2Pods: 1})
}

// The roles of the pods: pods 1 and 2 serve the measured service, pod 3
// is the client.
func servers(t *testnet.Topology) []*testnet.Pod {
	return []*testnet.Pod{t.Pod("node1-pod1"), t.Pod("node1-pod2")}
}

func clientPod(t *testnet.Topology) *testnet.Pod { return t.Pod("node1-pod3") }

// maxTargetEndpoints is how many endpoints the measured service can
// have: the addresses of targetRange.
const maxTargetEndpoints = 1<<16 - 2

// targetRange holds the measured service's endpoints at sizes of more
// than [scale.MaxSliceEndpoints] endpoints per service (see
// targetEndpoints); node1 routes its first half to the first server pod
// and its second half to the second.
var targetRange = netip.MustParsePrefix("10.245.0.0/16")

// targetEndpoints returns the measured service's endpoints at size sz.
// Up to [scale.MaxSliceEndpoints] endpoints per service it has two, the
// server pods' own addresses, as in earlier runs. With more it has as
// many as the other services, so that a connection is balanced over as
// many: endpoint j is address j+1 of one half of targetRange, taken
// whole by a server pod as local addresses (a local route), alternating
// between the two pods; every one answers.
func targetEndpoints(ctx context.Context, t *testnet.Topology, sz Size) ([]netip.Addr, error) {
	srv := servers(t)
	if sz.Endpoints <= scale.MaxSliceEndpoints {
		return []netip.Addr{srv[0].IPv4, srv[1].IPv4}, nil
	}
	halves := make([]netip.Prefix, len(srv))
	base := targetRange.Addr().As4()
	for i, p := range srv {
		b := base
		b[2] = byte(i * 128)
		halves[i] = netip.PrefixFrom(netip.AddrFrom4(b), targetRange.Bits()+1)
		// Via the pod's own address (the veth on node1's side is
		// pod<i+1>), so that node1 resolves one neighbour, not one per
		// endpoint (the neighbour table holds 1,024 by default).
		if _, err := t.Node1.Exec(ctx, "ip", "route", "add", halves[i].String(), "via", p.IPv4.String(), "dev", fmt.Sprintf("pod%d", i+1)); err != nil {
			return nil, err
		}
		if _, err := p.Exec(ctx, "ip", "route", "add", "local", halves[i].String(), "dev", "lo"); err != nil {
			return nil, err
		}
	}
	eps := make([]netip.Addr, sz.Endpoints)
	for j := range eps {
		b := halves[j%2].Addr().As4()
		v := binary.BigEndian.Uint32(b[:]) + uint32(j/2+1)
		binary.BigEndian.PutUint32(b[:], v)
		eps[j] = netip.AddrFrom4(b)
	}
	return eps, nil
}

// child is a running child process.
type child struct {
	once   sync.Once
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *json.Decoder
	stderr *tailBuffer
}

// startChild starts this binary in role with params.
func (r *runner) startChild(ctx context.Context, role, name string, params any) (*child, error) {
	cmd := exec.CommandContext(ctx, r.exe)
	cmd.Env = append(os.Environ(), envChild+"="+role)
	if role == roleConnect || role == roleCRRClient || role == roleCRRServer || role == roleUDPSender {
		// No preemption signals in the timed system calls.
		cmd.Env = append(cmd.Env, "GODEBUG=asyncpreemptoff=1")
	}
	// Its own process group keeps Ctrl-C from the terminal away from
	// it (the parent stops it and tears down); it dies with the parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Stopping it stops what it runs too (nft, iptables-restore).
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	c := &child{cmd: cmd, stderr: &tailBuffer{max: 8 << 10}}
	if r.o.Verbose {
		cmd.Stderr = io.MultiWriter(c.stderr, &prefixWriter{w: r.o.Log, prefix: "  [" + name + "] "})
	} else {
		cmd.Stderr = c.stderr
	}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.out = json.NewDecoder(bufio.NewReader(stdout))
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b, _ := json.Marshal(params)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
}

// read reads the child's next result line.
func (c *child) read() (childResult, error) {
	var res childResult
	if err := c.out.Decode(&res); err != nil {
		return res, c.failure(fmt.Errorf("read result: %w", err))
	}
	if res.Error != "" {
		return res, c.failure(errors.New(res.Error))
	}
	return res, nil
}

// failure adds the tail of the child's standard error to err.
func (c *child) failure(err error) error {
	if t := strings.TrimSpace(c.stderr.String()); t != "" {
		return fmt.Errorf("%w (stderr: %s)", err, t)
	}
	return err
}

// wait closes the child's input and waits for it to exit.
func (c *child) wait() error {
	var err error
	c.once.Do(func() {
		c.stdin.Close()
		err = c.cmd.Wait()
	})
	if err != nil {
		return c.failure(err)
	}
	return nil
}

// kill stops the child unless it was waited for.
func (c *child) kill() {
	c.once.Do(func() {
		c.stdin.Close()
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		c.cmd.Wait()
	})
}

// backendCase measures a proxykit backend at one size.
func (r *runner) backendCase(ctx context.Context, c *Case) {
	cctx, cancel := r.caseContext(ctx)
	defer cancel()
	if err := r.backendPrecondition(c.Name); err != "" {
		c.Status, c.Reason = "unsupported", err
		return
	}
	t, err := r.topology()
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	defer func() {
		r.flushRuleset(t)
		if err := t.Close(); err != nil {
			r.logf("teardown: %v", err)
		}
	}()
	p := proxierParams{
		Backend:   c.Name,
		NetNS:     t.Node1.Path(),
		PodNetNS:  []string{clientPod(t).Path()},
		Size:      c.Size,
		Changes:   r.o.Changes,
		ChangesMS: r.o.ChangesTime.Milliseconds(),
	}
	if r.o.ProfileDir != "" {
		p.Profile = filepath.Join(r.o.ProfileDir, c.Name+"-"+c.Size.String())
	}
	if p.Target, err = targetEndpoints(cctx, t, c.Size); err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return
	}
	switch c.Name {
	case "ebpf-tc":
		// The north-south options of the data-path mode (datapath.go).
		p.Backend, p.EBPF = "ebpf", map[string]string{"NorthSouth": "tc"}
	case "ebpf-xdp":
		p.Backend, p.EBPF = "ebpf", map[string]string{"NorthSouth": "xdp", "NorthSouthXDPVeth": "true"}
	case "iptables":
		p.IPTMode = r.iptFlavour
	case "iptables-nft":
		p.IPTMode = "nft"
	case "iptables-legacy":
		p.IPTMode = "legacy"
	}
	var cg string
	if strings.HasPrefix(c.Name, "ebpf") {
		cg = filepath.Join(r.cgroup2, "proxykit-bench-"+t.ID)
		if err := os.Mkdir(cg, 0o755); err != nil {
			c.Status, c.Reason = "error", oneLine(err.Error())
			return
		}
		defer removeCgroup(cg)
		p.Cgroup = cg
	}
	ch, err := r.startChild(cctx, roleProxier, c.Name+" "+c.Size.String(), p)
	if err != nil {
		r.fail(ctx, cctx, c, err)
		return
	}
	defer ch.kill()
	res, err := ch.read()
	if err != nil {
		r.fail(ctx, cctx, c, err)
		return
	}
	if res.Unsupported != "" {
		c.Status, c.Reason = "unsupported", oneLine(res.Unsupported)
		if c.Name == "ipvs" {
			c.Reason = "ipvs: no IPVS in this kernel (" + c.Reason + "). The IPVS backend's own benchmarks " +
				"(backends/ipvs/bench_test.go) run in a VM: `hack/vmtest.sh ./backends/ipvs/ -- -run='^$' -bench=.`"
		}
		return
	}
	c.SyncSeconds, c.SyncCPUSeconds, c.FeedSeconds = res.SyncSeconds, res.SyncCPUSeconds, res.FeedSeconds
	c.PeakRSSMB = float64(res.HWMKB) / 1024
	c.Change = stats(res.ChangesNS, 1e6)
	if err := r.connect(cctx, c, t, cg); err != nil {
		r.fail(ctx, cctx, c, fmt.Errorf("connect: %w", err))
		return
	}
	ch.stdin.Write([]byte("done\n"))
	_, err = ch.read()
	if err == nil {
		err = ch.wait()
	}
	if err != nil {
		r.fail(ctx, cctx, c, err)
		return
	}
	c.Status = "ok"
}

// flushRuleset removes every nftables rule of the node's namespace
// (iptables-nft's included) before the namespace goes, in one
// transaction, so that the kernel's work of freeing a large rule set is
// done before the next case starts rather than under it.
func (r *runner) flushRuleset(t *testnet.Topology) {
	if _, err := exec.LookPath("nft"); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := t.Node1.Exec(ctx, "nft", "flush", "ruleset"); err != nil {
		r.logf("flush ruleset: %v", err)
	}
}

// connect measures connections from the client pod to the measured
// service in a child process (in cgroup cg, when set).
func (r *runner) connect(ctx context.Context, c *Case, t *testnet.Topology, cg string) error {
	p := connectParams{
		NetNS:  clientPod(t).Path(),
		Cgroup: cg,
		Dst:    netip.AddrPortFrom(scale.TargetIP, scale.Port),
		N:      r.o.Connects,
		Warmup: min(100, max(10, r.o.Connects/10)),
	}
	ch, err := r.startChild(ctx, roleConnect, "connect", p)
	if err != nil {
		return err
	}
	defer ch.kill()
	res, err := ch.read()
	if err != nil {
		return err
	}
	if err := ch.wait(); err != nil {
		return err
	}
	c.Connect, c.FirstByte = stats(res.ConnectNS, 1e3), stats(res.FirstByteNS, 1e3)
	return nil
}

// backendPrecondition says why a backend cannot run here, or "".
func (r *runner) backendPrecondition(name string) string {
	switch {
	case strings.HasPrefix(name, "ebpf") && r.cgroup2 == "":
		return "no cgroup v2 file system mounted"
	case strings.HasPrefix(name, "iptables") && r.iptFlavour == "":
		return "no iptables installed"
	}
	return ""
}

func removeCgroup(dir string) {
	for i := 0; i < 50; i++ {
		if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "bench: could not remove cgroup %s\n", dir)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// prefixWriter prefixes every line.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	mid    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, c := range b {
		if !p.mid {
			out = append(out, p.prefix...)
			p.mid = true
		}
		out = append(out, c)
		if c == '\n' {
			p.mid = false
		}
	}
	_, err := p.w.Write(out)
	return len(b), err
}
