package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/cputime"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// The measurements run in child processes: this binary (or the test
// binary) re-executed with envChild naming the role. The parameters come
// as one JSON line on standard input, the results go out as JSON lines on
// standard output; logs go to standard error.
const envChild = "PROXYKIT_BENCH_CHILD"

const (
	roleProxier = "proxier"
	roleConnect = "connect"
	roleLoad    = "load"
)

// childMain runs the child role named by envChild and exits; it returns
// false when the process is not a child.
func childMain() bool {
	role := os.Getenv(envChild)
	if role == "" {
		return false
	}
	in := bufio.NewReader(os.Stdin)
	var err error
	switch role {
	case roleProxier:
		err = proxierChild(in)
	case roleConnect:
		err = connectChild(in)
	case roleLoad:
		err = loadChild(in)
	default:
		if f, ok := datapathRoles[role]; ok {
			err = f(in)
		} else {
			err = fmt.Errorf("unknown child role %q", role)
		}
	}
	if err != nil {
		json.NewEncoder(os.Stdout).Encode(childResult{Error: err.Error()})
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// proxierParams is the proxier child's input.
type proxierParams struct {
	Backend   string
	NetNS     string
	PodNetNS  []string
	Cgroup    string
	Size      Size
	Target    []netip.Addr
	Changes   int
	ChangesMS int64
	IPTMode   string
	// EBPF sets fields of ebpf.Config by name (data-path mode).
	EBPF map[string]string `json:",omitempty"`
	// Profile, when set, is the path prefix of pprof profiles: CPU of
	// the first sync (-sync.cpu.pprof) and of the endpoint changes
	// (-changes.cpu.pprof), heap after the changes (-heap.pprof, after
	// the resident set is read).
	Profile string `json:",omitempty"`
}

// childResult is a child's output line.
type childResult struct {
	Error       string `json:",omitempty"`
	Unsupported string `json:",omitempty"`
	// Unavailable says the backend lacks an option a data-path path
	// asks for (a Config field, or a value New refuses).
	Unavailable string  `json:",omitempty"`
	FeedSeconds float64 `json:",omitempty"`
	SyncSeconds float64 `json:",omitempty"`
	// SyncCPUSeconds is the CPU time (user and system, every thread)
	// the proxier process spent in its first sync; not that of programs
	// it runs (iptables-restore).
	SyncCPUSeconds float64 `json:",omitempty"`
	// ChangesNS are the endpoint change latencies.
	ChangesNS []int64 `json:",omitempty"`
	// HWMKB and RSSKB are VmHWM and VmRSS of the proxier process after
	// the changes.
	HWMKB, RSSKB int64 `json:",omitempty"`
	// LoadNS and LoadRSSKB are the load child's timing and the loader's
	// peak resident set.
	LoadNS    int64 `json:",omitempty"`
	LoadRSSKB int64 `json:",omitempty"`
	// ConnectNS and FirstByteNS are the connect child's timings.
	ConnectNS   []int64 `json:",omitempty"`
	FirstByteNS []int64 `json:",omitempty"`
	// CRR and UDP are the data-path children's runs.
	CRR *crrResult `json:",omitempty"`
	UDP *udpResult `json:",omitempty"`
	// XDP are the data-path proxier's XDP counters.
	XDP *xdpCounts `json:",omitempty"`
}

func readParams(in *bufio.Reader, v any) error {
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("read parameters: %w", err)
	}
	return json.Unmarshal(line, v)
}

func roundPow2(n int) int { return 1 << bits.Len(uint(n-1)) }

// newProxier builds the named backend's proxier.
func newProxier(p proxierParams, cfg proxier.Config) (proxier.Proxier, error) {
	switch p.Backend {
	case "nftables":
		return nftables.New(nftables.Config{Config: cfg})
	case "iptables", "iptables-nft", "iptables-legacy":
		return iptables.New(iptables.Config{Config: cfg, Mode: iptables.Mode(p.IPTMode)})
	case "ebpf", "ebpf-socket", "ebpf-maglev":
		eps := p.Size.Services*p.Size.Endpoints + len(p.Target)
		c := ebpf.Config{
			Config:      cfg,
			CgroupPath:  p.Cgroup,
			PodNetNS:    p.PodNetNS,
			SocketOnly:  p.Backend != "ebpf",
			MaxServices: max(ebpf.DefaultMaxServices, roundPow2(2*p.Size.Services+64)),
			MaxBackends: max(ebpf.DefaultMaxBackends, roundPow2(eps+1024)),
		}
		if p.Backend == "ebpf-maglev" {
			// One table per endpoint group: every service has its own.
			c.Scheduler = proxier.SchedulerMaglev
			c.MaxMaglevTables = max(ebpf.DefaultMaxMaglevTables, roundPow2(p.Size.Services+64))
		}
		if err := setConfigFields(&c, p.EBPF); err != nil {
			return nil, err
		}
		return ebpf.New(c)
	case "ipvs":
		return ipvs.New(ipvs.Config{Config: cfg})
	}
	return nil, fmt.Errorf("unknown backend %q", p.Backend)
}

// proxierChild runs one backend's proxier in the namespace the parent
// named: it feeds every object, times the first sync and the endpoint
// changes, reports, waits for the parent to finish its connection
// measurements (a line on standard input), then cleans up.
func proxierChild(in *bufio.Reader) error {
	var p proxierParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := proxier.Config{
		NetNS:    p.NetNS,
		NodeName: "node1",
		Families: []model.IPFamily{model.IPv4},
		// Event to kernel, not the rate limiter: kube-proxy's default
		// minimum interval of 1 s would dominate every change.
		MinSyncInterval:       time.Millisecond,
		SyncPeriod:            time.Hour,
		NoServiceHealthChecks: true,
		Logger:                log,
	}
	pr, err := newProxier(p, cfg)
	if err != nil {
		if errors.Is(err, proxier.ErrNotSupported) {
			return out.Encode(childResult{Unsupported: err.Error()})
		}
		return err
	}
	svcs := scale.Services(p.Size.Services, p.Size.Endpoints)
	target := scale.Target("node1", p.Target...)
	objs, slices := scale.Objects(append(svcs, target))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var res childResult
	start := time.Now()
	for _, o := range objs {
		pr.OnServiceAdd(o)
	}
	for _, s := range slices {
		pr.OnEndpointSliceAdd(s)
	}
	pr.OnServiceSynced()
	pr.OnEndpointSlicesSynced()
	res.FeedSeconds = time.Since(start).Seconds()

	stop, err := startCPUProfile(p.Profile, "-sync.cpu.pprof")
	if err != nil {
		return err
	}
	start = time.Now()
	cpu := cputime.Process()
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()
	if err := pr.Flush(ctx); err != nil {
		return fmt.Errorf("first sync: %w", err)
	}
	res.SyncSeconds = time.Since(start).Seconds()
	res.SyncCPUSeconds = (cputime.Process() - cpu).Seconds()
	if err := stop(); err != nil {
		return err
	}
	if stop, err = startCPUProfile(p.Profile, "-changes.cpu.pprof"); err != nil {
		return err
	}

	changesEnd := time.Now().Add(time.Duration(p.ChangesMS) * time.Millisecond)
	for k := range p.Changes {
		if k >= 5 && time.Now().After(changesEnd) {
			break
		}
		// A change replaces a service's first endpoint: its first
		// slice changes. Every generated service has as many slices.
		idx, upd := scale.Change(svcs, k)
		sl := upd.Slice(k + 1)
		first := idx * upd.NumSlices()
		time.Sleep(2 * time.Millisecond) // past the minimum sync interval
		t0 := time.Now()
		pr.OnEndpointSliceUpdate(slices[first], sl)
		if err := pr.Flush(ctx); err != nil {
			return fmt.Errorf("endpoint change %d: %w", k, err)
		}
		res.ChangesNS = append(res.ChangesNS, time.Since(t0).Nanoseconds())
		svcs[idx], slices[first] = upd, sl
	}
	res.HWMKB, res.RSSKB = procStatusKB("VmHWM"), procStatusKB("VmRSS")
	if err := stop(); err != nil {
		return err
	}
	if err := writeHeapProfile(p.Profile, "-heap.pprof"); err != nil {
		return err
	}
	if err := out.Encode(res); err != nil {
		return err
	}
	// The parent measures connections now; it writes a line (or closes
	// standard input) when done. The dataplane is left in place (Close,
	// not Cleanup): the parent removes the namespace.
	in.ReadString('\n')
	cancel()
	<-done
	runtime.KeepAlive(objs)
	if err := pr.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return out.Encode(childResult{})
}

// startCPUProfile starts a CPU profile into prefix+suffix and returns
// what stops it; with no prefix it does nothing.
func startCPUProfile(prefix, suffix string) (stop func() error, err error) {
	if prefix == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(prefix + suffix)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// writeHeapProfile writes the live heap, after a collection, into
// prefix+suffix; with no prefix it does nothing.
func writeHeapProfile(prefix, suffix string) error {
	if prefix == "" {
		return nil
	}
	f, err := os.Create(prefix + suffix)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// procStatusKB returns a field of /proc/self/status in kB.
func procStatusKB(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// connectParams is the connect child's input.
type connectParams struct {
	NetNS  string
	Cgroup string
	Dst    netip.AddrPort
	N      int
	Warmup int
}

// connectChild opens N TCP connections (after Warmup untimed ones) from
// the namespace to Dst, one at a time, with blocking system calls on a
// locked thread (no Go scheduler in the way), and reports how long each
// took to connect (the handshake, through the service translation both
// ways) and to read the server's first byte. With a cgroup it moves
// itself there first, so that the eBPF backend's socket programs see its
// sockets.
func connectChild(in *bufio.Reader) error {
	var p connectParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	if p.Cgroup != "" {
		if err := os.WriteFile(p.Cgroup+"/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	ns, err := netns.Open(p.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	var res childResult
	sa := &unix.SockaddrInet4{Port: int(p.Dst.Port()), Addr: p.Dst.Addr().As4()}
	err = ns.Do(func() error {
		buf := make([]byte, 256)
		for i := range p.Warmup + p.N {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			// Close with RST, so that TIME_WAIT does not pile up.
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
			tv := unix.Timeval{Sec: 3}
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
			start := time.Now()
			err = connect(fd, sa, start.Add(3*time.Second))
			connected := time.Now()
			if err == nil {
				var k int
				for {
					k, err = unix.Read(fd, buf)
					if err != unix.EINTR {
						break
					}
				}
				if err == nil && k == 0 {
					err = errors.New("connection closed before the first byte")
				}
			}
			done := time.Now()
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("connection %d to %s: %w", i, p.Dst, err)
			}
			if i >= p.Warmup {
				res.ConnectNS = append(res.ConnectNS, connected.Sub(start).Nanoseconds())
				res.FirstByteNS = append(res.FirstByteNS, done.Sub(start).Nanoseconds())
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// connect connects the blocking socket fd to sa. A signal (the Go
// runtime's preemption) interrupts a connect with a send timeout: the
// handshake goes on, so wait for it with poll and read its outcome.
func connect(fd int, sa unix.Sockaddr, deadline time.Time) error {
	err := unix.Connect(fd, sa)
	if err != unix.EINTR {
		return err
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soerr != 0 {
			return unix.Errno(soerr)
		}
		return nil
	}
}

// loadParams is the load child's input.
type loadParams struct {
	NetNS string
	Argv  []string
	Input string // a file, the program's standard input
}

// loadChild runs a program (a kube-proxy reference's nft or
// iptables-restore) in a namespace with a file as its input, and reports
// how long it ran and its peak resident set. It is a process of its own
// because a process's peak resident set (ru_maxrss) starts from that of
// the process it was forked from, which for the benchmark's parent holds
// the generated rule sets: this small process is a clean parent.
func loadChild(in *bufio.Reader) error {
	var p loadParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	f, err := os.Open(p.Input)
	if err != nil {
		return err
	}
	defer f.Close()
	ns, err := netns.Open(p.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	var res childResult
	err = ns.Do(func() error {
		cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
		cmd.Stdin = f
		// Forked from this thread, which waits for it: it dies with
		// this process.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		// The child is forked from this locked thread, so it starts in
		// the namespace.
		start := time.Now()
		err := cmd.Run()
		res.LoadNS = time.Since(start).Nanoseconds()
		if err != nil {
			return fmt.Errorf("%s: %w: %.2000s", strings.Join(p.Argv, " "), err, out.String())
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			res.LoadRSSKB = ru.Maxrss
		}
		return nil
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
