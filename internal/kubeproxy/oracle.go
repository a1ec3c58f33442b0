package kubeproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
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

	"github.com/proxykit/proxykit/internal/netns"
)

// Mode is kube-proxy's --proxy-mode.
type Mode string

// The modes the oracle runs.
const (
	NFTables Mode = "nftables"
	IPTables Mode = "iptables"
)

// Options are the oracle's command line, named after kube-proxy's flags.
// Zero values leave kube-proxy's defaults.
type Options struct {
	// Mode is the proxier; default NFTables.
	Mode Mode
	// NodeIPs are the node's primary IP per family, the primary family
	// first (--node-ips). One family makes the oracle single-stack, two
	// dual-stack (kube-proxy's metaproxier). Required.
	NodeIPs []netip.Addr
	// HostnameOverride is the node's name, which EndpointSlices'
	// nodeName is compared with; default the host name.
	HostnameOverride string
	// ClusterCIDRs are the pod networks, at most one per family
	// (detect-local-mode ClusterCIDR); none means no traffic is local.
	ClusterCIDRs []netip.Prefix
	// NodePortAddresses are CIDRs, or the single word "primary", where
	// NodePorts are served; default "primary" in nftables mode, every
	// local address in iptables mode.
	NodePortAddresses []string
	// MasqueradeAll SNATs all traffic sent via a Service's cluster IP.
	MasqueradeAll bool
	// MasqueradeBit is the packet mark bit for masquerading; nil means 14.
	MasqueradeBit *int
	// LocalhostNodePorts lets iptables mode accept NodePort connections
	// to 127.0.0.1 (and sets route_localnet); nil means true.
	LocalhostNodePorts *bool
	// ServiceCIDRs are the service ranges, standing for the default
	// ServiceCIDR object the API server creates from its
	// --service-cluster-ip-range. nftables mode rejects traffic to
	// unallocated addresses in them. ServiceCIDR objects in applied
	// files add to them.
	ServiceCIDRs []netip.Prefix
	// NodeLabels are the labels of the node's Node object; of them
	// kube-proxy uses topology.kubernetes.io/zone (topology hints).
	NodeLabels map[string]string
	// FeatureGates are passed as --feature-gates.
	FeatureGates map[string]bool
	// Verbosity is klog's --v; default 0. 2 logs every sync, 9 the
	// whole nftables transaction.
	Verbosity int
	// ExtraArgs are appended to the command line.
	ExtraArgs []string

	// Binary is the oracle to run; default [Binary]'s.
	Binary string
	// Stderr, if set, receives a copy of the oracle's log.
	Stderr io.Writer
	// Logger logs the oracle's start and end at debug level; default
	// slog.Default().
	Logger *slog.Logger
}

// Args returns the oracle's command-line flags for o.
func (o Options) Args() []string {
	var args []string
	add := func(name, value string) { args = append(args, "--"+name+"="+value) }
	mode := o.Mode
	if mode == "" {
		mode = NFTables
	}
	add("proxy-mode", string(mode))
	add("node-ips", joinAddrs(o.NodeIPs))
	if o.HostnameOverride != "" {
		add("hostname-override", o.HostnameOverride)
	}
	if len(o.ClusterCIDRs) > 0 {
		add("cluster-cidr", joinAddrs(o.ClusterCIDRs))
	}
	if len(o.NodePortAddresses) > 0 {
		add("nodeport-addresses", strings.Join(o.NodePortAddresses, ","))
	}
	if o.MasqueradeAll {
		add("masquerade-all", "true")
	}
	if o.MasqueradeBit != nil {
		add("masquerade-bit", strconv.Itoa(*o.MasqueradeBit))
	}
	if o.LocalhostNodePorts != nil {
		add("iptables-localhost-nodeports", strconv.FormatBool(*o.LocalhostNodePorts))
	}
	if len(o.ServiceCIDRs) > 0 {
		add("service-cidrs", joinAddrs(o.ServiceCIDRs))
	}
	if len(o.NodeLabels) > 0 {
		var kvs []string
		for _, k := range slices.Sorted(maps.Keys(o.NodeLabels)) {
			kvs = append(kvs, k+"="+o.NodeLabels[k])
		}
		add("node-labels", strings.Join(kvs, ","))
	}
	if len(o.FeatureGates) > 0 {
		var kvs []string
		for _, k := range slices.Sorted(maps.Keys(o.FeatureGates)) {
			kvs = append(kvs, k+"="+strconv.FormatBool(o.FeatureGates[k]))
		}
		add("feature-gates", strings.Join(kvs, ","))
	}
	if o.Verbosity != 0 {
		add("v", strconv.Itoa(o.Verbosity))
	}
	return append(args, o.ExtraArgs...)
}

func joinAddrs[T fmt.Stringer](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// Oracle is a running kube-proxy oracle. Its methods are safe for
// concurrent use; applies are serialised.
type Oracle struct {
	netns  string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	answer chan string // protocol lines; closed at the end of stdout
	stderr *tailBuffer
	done   chan struct{} // closed when the process has exited
	err    error         // its exit status, once done is closed
	logger *slog.Logger

	mu     sync.Mutex // serialises Apply and Close
	broken error      // set when the protocol state is unknown
	closed bool
}

// Start starts the oracle in the network namespace at netnsPath (e.g.
// /var/run/netns/NAME). The process is forked from a thread that has
// entered the namespace, so it runs there from its first instruction; it
// gets SIGKILL if the calling process dies. ctx bounds only the start; the
// process runs until [Oracle.Close]. A configuration the oracle rejects
// shows as an error of the first [Oracle.Apply].
func Start(ctx context.Context, netnsPath string, opts Options) (*Oracle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(opts.NodeIPs) == 0 {
		return nil, errors.New("kubeproxy: Options.NodeIPs is required")
	}
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	ns, err := netns.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()

	o := &Oracle{
		netns:  netnsPath,
		answer: make(chan string, 16),
		stderr: &tailBuffer{max: 256 << 10},
		done:   make(chan struct{}),
		logger: logger,
	}
	// The oracle is forked from a thread inside the namespace, so its
	// parent process may be anywhere: it checks it is in netnsPath.
	args := append(opts.Args(), "--netns="+netnsPath)
	o.cmd = exec.Command(bin, args...)
	if opts.Stderr != nil {
		o.cmd.Stderr = io.MultiWriter(o.stderr, opts.Stderr)
	} else {
		o.cmd.Stderr = o.stderr
	}
	// Pdeathsig: strictly, when the thread that forked exits, which the
	// Go runtime does only for a goroutine that ends locked to it (netns.Do
	// unlocks unless leaving the namespace failed). Setpgid: a terminal's
	// Ctrl-C reaches the test, whose cleanup stops the oracle.
	o.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if o.stdin, err = o.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	// A pipe of our own rather than StdoutPipe, which Wait would close
	// while the last answers may still be unread.
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	o.cmd.Stdout = w
	err = ns.Do(o.cmd.Start)
	w.Close()
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("kubeproxy: start %s in %s: %w", bin, netnsPath, err)
	}
	logger.Debug("kube-proxy oracle started", "pid", o.cmd.Process.Pid, "netns", netnsPath, "args", args)
	go func() {
		defer stdout.Close()
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			o.answer <- s.Text()
		}
		close(o.answer)
	}()
	go func() {
		o.err = o.cmd.Wait()
		close(o.done)
	}()
	return o, nil
}

// New starts an oracle for a test and closes it in tb.Cleanup. It skips
// the test when the binary is missing ([RequireBinary]) and fails it when
// the oracle does not start; when the test fails, the end of the oracle's
// log goes to the test log. netnsPath is as for [Start].
func New(tb testing.TB, netnsPath string, opts Options) *Oracle {
	tb.Helper()
	if opts.Binary == "" {
		opts.Binary = RequireBinary(tb)
	}
	o, err := Start(context.Background(), netnsPath, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := o.Close(); err != nil {
			tb.Errorf("kubeproxy: %v", err)
		}
		if tb.Failed() {
			tb.Logf("kubeproxy: end of the oracle's log (%s):\n%s", netnsPath, o.StderrTail(40))
		}
	})
	return o
}

// Apply makes the oracle's objects those of the YAML file at path (see the
// package documentation) and returns once kube-proxy's rules for them are
// in the kernel. An error carries the oracle's answer and the end of its
// log. When ctx ends first, the oracle is left in an unknown state and
// every later Apply fails.
func (o *Oracle) Apply(ctx context.Context, path string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errors.New("kubeproxy: apply on a closed oracle")
	}
	if o.broken != nil {
		return o.broken
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if strings.ContainsAny(abs, "\r\n") {
		return fmt.Errorf("kubeproxy: path %q contains a line break", abs)
	}
	if _, err := io.WriteString(o.stdin, "apply "+abs+"\n"); err != nil {
		return o.exited(fmt.Sprintf("apply %s: write command: %v", path, err))
	}
	select {
	case line, ok := <-o.answer:
		switch {
		case !ok:
			return o.exited("apply " + path)
		case line == "synced":
			return nil
		case strings.HasPrefix(line, "error: "):
			return fmt.Errorf("kubeproxy: apply %s: %s; end of the oracle's log:\n%s", path, strings.TrimPrefix(line, "error: "), o.StderrTail(20))
		default:
			o.broken = fmt.Errorf("kubeproxy: apply %s: unexpected answer %q; end of the oracle's log:\n%s", path, line, o.StderrTail(20))
			return o.broken
		}
	case <-ctx.Done():
		o.broken = fmt.Errorf("kubeproxy: apply %s: no answer: %w; end of the oracle's log:\n%s", path, context.Cause(ctx), o.StderrTail(20))
		return o.broken
	}
}

// exited waits briefly for the process to end after its stdout closed or
// a write failed, and describes how it ended.
func (o *Oracle) exited(what string) error {
	select {
	case <-o.done:
	case <-time.After(5 * time.Second):
	}
	var status any = "still running"
	select {
	case <-o.done:
		status = o.err
		if o.err == nil {
			status = "exit status 0"
		}
	default:
	}
	o.broken = fmt.Errorf("kubeproxy: %s: the oracle ended its output (%v); end of its log:\n%s", what, status, o.StderrTail(30))
	return o.broken
}

// Close asks the oracle to quit and waits for it, killing it after 5 s.
// It leaves the namespace's rules as they are (delete the namespace). The
// error reports an unexpected exit status.
func (o *Oracle) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	_, _ = io.WriteString(o.stdin, "quit\n")
	_ = o.stdin.Close()
	killed := false
	select {
	case <-o.done:
	case <-time.After(5 * time.Second):
		_ = o.cmd.Process.Kill()
		killed = true
		<-o.done
	}
	o.logger.Debug("kube-proxy oracle stopped", "pid", o.cmd.Process.Pid, "netns", o.netns, "killed", killed, "status", o.err)
	if o.err != nil && !killed {
		return fmt.Errorf("kubeproxy: oracle in %s: %w; end of its log:\n%s", o.netns, o.err, o.StderrTail(20))
	}
	return nil
}

// StderrTail returns the last n lines the oracle wrote to its standard
// error (kube-proxy's log), of the last 256 KiB.
func (o *Oracle) StderrTail(n int) string { return o.stderr.tail(n) }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimRight(t.buf, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
