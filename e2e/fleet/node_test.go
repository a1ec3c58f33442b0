package fleet

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
)

// Probe timing.
const (
	// probeTimeout bounds one TCP probe. A port the proxier has not
	// programmed yet is rejected at once (its cluster IP is in a
	// ServiceCIDR); the timeout covers a drop.
	probeTimeout = 200 * time.Millisecond
	// pollInterval is how often a node's delivered writes are probed when
	// no nf_tables generation was announced meanwhile (a fallback: a sync
	// that programs a write commits a generation).
	pollInterval = time.Second
	// observeLimit is how long a write may take to reach a node's
	// dataplane before it counts as lost.
	observeLimit = 30 * time.Second
)

// write is one churn write: a Service (its port moved) or an
// EndpointSlice (its endpoint moved to the other pod).
type write struct {
	id   int
	kind string // "svc" or "slice", as in the child's event lines
	key  string // namespace/name of the object written
	// dst is the service's cluster IP and port after the write, and pod
	// the pod that must answer there.
	dst netip.AddrPort
	pod string
	t0  time.Time // before the request was sent
	// api is how long the API request took; err its failure.
	api time.Duration
	err error
	// delivered and programmed are, per node, the time from t0 until the
	// node's proxier received the update, and until a probe through the
	// node's dataplane was answered by pod (zero: not seen).
	delivered, programmed []time.Duration
}

// node is one node namespace with its proxier process.
type node struct {
	i    int
	name string // the Node object's and the proxier's node name
	tp   *testnet.Topology

	cmd     *exec.Cmd
	started time.Time
	logPath string
	done    chan struct{} // closed when the process has exited
	exitErr error

	kick chan struct{} // a new nf_tables generation in the namespace

	mu       sync.Mutex
	lastGen  time.Time         // when the last generation was announced
	gens     int               // generations announced
	syncs    []syncRecord      // the proxier's successful syncs, in order
	pending  []*write          // not yet programmed here
	awaiting map[string]*write // kind+" "+key -> write whose update event is due
	lost     []*write          // not programmed within observeLimit
}

// syncRecord is one successful sync as the proxier logged it.
type syncRecord struct {
	end  time.Time
	took time.Duration // of the backend's Sync
	full bool
}

// start runs the node's proxier process: the test binary in the child
// role. Its event lines are read until it exits; its logs go to a file.
func (n *node) start(t *testing.T, p childParams) {
	t.Helper()
	params, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	n.logPath = filepath.Join(t.TempDir(), n.name+".log")
	logf, err := os.Create(n.logPath)
	if err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(os.Args[0], "-test.run=^$")
	n.cmd.Env = append(os.Environ(), envChild+"="+string(params))
	n.cmd.Stderr = logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	n.started = time.Now()
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.done = make(chan struct{})
	go func() {
		n.readEvents(stdout)
		n.exitErr = n.cmd.Wait()
		logf.Close()
		close(n.done)
	}()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(10 * time.Second):
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	})
}

// exited reports whether the proxier process has exited.
func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// readEvents records, for each update line of the child, the delivery
// of the write it answers.
func (n *node) readEvents(r io.Reader) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 4 && f[0] == "S" {
			end, err1 := strconv.ParseInt(f[1], 10, 64)
			d, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil {
				n.mu.Lock()
				n.syncs = append(n.syncs, syncRecord{end: time.Unix(0, end), took: time.Duration(d), full: f[3] == "true"})
				n.mu.Unlock()
			}
			continue
		}
		if len(f) != 4 || f[0] != "E" {
			continue
		}
		ns, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		n.mu.Lock()
		w := n.awaiting[f[1]+" "+f[2]]
		if w != nil && at.After(w.t0) {
			w.delivered[n.i] = at.Sub(w.t0)
			delete(n.awaiting, f[1]+" "+f[2])
			if n.lastGen.After(w.t0) {
				// A generation since the write may hold it already: its
				// probe was skipped, the write not being delivered then.
				n.signal()
			}
		}
		n.mu.Unlock()
	}
}

// expect registers w as due on this node.
func (n *node) expect(w *write) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pending = append(n.pending, w)
	n.awaiting[w.kind+" "+w.key] = w
}

// unprogrammed returns how many writes are pending here.
func (n *node) unprogrammed() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.pending)
}

// watchGenerations sends on n.kick whenever the kernel announces a new
// nf_tables generation (a committed transaction) in the node namespace,
// until ctx ends: the moment to probe again. It listens on the
// NFNLGRP_NFTABLES multicast group, which carries every object of every
// transaction, through a socket filter that keeps only the NEWGEN
// messages; a socket buffer overrun (ENOBUFS) counts as a generation
// too.
func (n *node) watchGenerations(ctx context.Context) error {
	f, err := os.Open(n.tp.Node1.Path())
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{
		NetNS:  int(f.Fd()),
		Groups: 1 << (unix.NFNLGRP_NFTABLES - 1),
	})
	if err != nil {
		return fmt.Errorf("nf_tables monitor in %s: %w", n.tp.Node1, err)
	}
	// Only NEWGEN messages pass (each comes in a datagram of its own):
	// the objects of a full resync are not even queued.
	if err := c.SetBPF(newgenFilter()); err != nil {
		c.Close()
		return fmt.Errorf("nf_tables monitor in %s: %w", n.tp.Node1, err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	newgen := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)
	for {
		msgs, err := c.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			c.Close()
			return fmt.Errorf("nf_tables monitor in %s: %w", n.tp.Node1, err)
		}
		gen := err != nil
		for _, m := range msgs {
			gen = gen || m.Header.Type == newgen
		}
		if gen {
			n.mu.Lock()
			n.lastGen = time.Now()
			n.gens++
			n.mu.Unlock()
			n.signal()
		}
	}
}

// newgenFilter is a socket filter that keeps the datagrams whose first
// netlink message is an nf_tables NEWGEN.
func newgenFilter() []bpf.RawInstruction {
	// nlmsg_type is in host byte order at offset 4; BPF loads big endian.
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN)
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(binary.BigEndian.Uint16(b[:])), SkipFalse: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		panic(err)
	}
	return prog
}

// signal wakes probeLoop up.
func (n *node) signal() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// probe opens a TCP connection from the node namespace to dst and
// returns the name of the pod that answered, or "".
func (n *node) probe(dst netip.AddrPort) string {
	var server string
	_ = n.tp.Node1.Do(func() error {
		server = probeHere(dst)
		return nil
	})
	return server
}

// probeHere is probe from the calling thread's namespace. It ends the
// connection with a reset (SO_LINGER 0), so the node's conntrack entry
// lasts 10 s (CLOSE) rather than 120 s (TIME_WAIT).
func probeHere(dst netip.AddrPort) string {
	deadline := time.Now().Add(probeTimeout)
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp4", dst.String())
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.SetDeadline(deadline)
	b, err := io.ReadAll(io.LimitReader(c, 512))
	if err != nil {
		return ""
	}
	r, err := testnet.ParseReply(string(b))
	if err != nil {
		return ""
	}
	return r.Server
}

// probeLoop probes the node's delivered writes after every new
// generation and every pollInterval, until ctx ends. A write is
// programmed on this node when a TCP connection from the node to its
// cluster IP and port is answered by its pod; one not programmed within
// observeLimit is lost. A write the node's proxier has not received yet
// is not probed: it cannot be programmed, and probing it would only load
// the machine. The loop runs on a thread of its own that stays in the
// node namespace until the loop ends, so a probe costs no namespace
// switch. (The thread goes back to its namespace then: were it to exit
// instead, the proxier processes started from it would get their
// Pdeathsig.)
func (n *node) probeLoop(ctx context.Context) (err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	f, err := os.Open(n.tp.Node1.Path())
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
	f.Close()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter %s: %w", n.tp.Node1, err)
	}
	defer func() {
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); rerr != nil {
			// Stay locked: the runtime ends the thread with the goroutine.
			err = errors.Join(err, fmt.Errorf("leave %s: %w", n.tp.Node1, rerr))
			return
		}
		runtime.UnlockOSThread()
	}()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.kick:
		case <-tick.C:
		}
		n.mu.Lock()
		var due []*write
		done := map[*write]bool{}
		for _, w := range n.pending {
			switch {
			case w.delivered[n.i] > 0:
				due = append(due, w)
			case time.Since(w.t0) > observeLimit:
				done[w] = true
				n.lost = append(n.lost, w)
			}
		}
		n.mu.Unlock()
		for _, w := range due {
			if probeHere(w.dst) == w.pod {
				w.programmed[n.i] = time.Since(w.t0)
				done[w] = true
			} else if time.Since(w.t0) > observeLimit {
				done[w] = true
				n.mu.Lock()
				n.lost = append(n.lost, w)
				n.mu.Unlock()
			}
		}
		if len(done) == 0 {
			continue
		}
		n.mu.Lock()
		kept := n.pending[:0]
		for _, w := range n.pending {
			if !done[w] {
				kept = append(kept, w)
			}
		}
		n.pending = kept
		n.mu.Unlock()
	}
}
