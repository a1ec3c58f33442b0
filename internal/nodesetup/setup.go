package nodesetup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// system is what the setup reads and writes: the sysctls of the target
// namespace (keys below /proc/sys) and host files (absolute paths).
type system interface {
	read(key string) (string, error)
	write(key, value string) error
	// checkWrite returns nil when key's file may be written, else why:
	// fs.ErrPermission (EACCES) for a sysctl the kernel made read-only
	// in this namespace, syscall.EROFS for a read-only mount,
	// fs.ErrNotExist.
	checkWrite(key string) error
}

// env is one run of Apply or Plan.
type env struct {
	sys     system
	netns   string // for errors and logs
	initial bool   // the target is the initial network namespace
	numCPU  int
	release string // kernel release, e.g. "6.1.0-18-amd64"
	apply   bool   // false: Plan
	log     *slog.Logger

	changes []Change
}

// validate refuses what kube-proxy's configuration validation refuses,
// before anything is changed.
func validate(cfg Config) error {
	switch cfg.Mode {
	case "", "iptables", "ipvs", "nftables", "ebpf":
	default:
		return fmt.Errorf("nodesetup: Config.Mode: unknown mode %q (want nftables, iptables, ipvs or ebpf)", cfg.Mode)
	}
	c := cfg.Conntrack
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"Conntrack.MaxPerCore", c.MaxPerCore < 0},
		{"Conntrack.Min", c.Min < 0},
		{"Conntrack.TCPEstablishedTimeout", c.TCPEstablishedTimeout < 0},
		{"Conntrack.TCPCloseWaitTimeout", c.TCPCloseWaitTimeout < 0},
		{"Conntrack.UDPTimeout", c.UDPTimeout < 0},
		{"Conntrack.UDPStreamTimeout", c.UDPStreamTimeout < 0},
	} {
		if f.neg {
			return fmt.Errorf("nodesetup: Config.%s: must be greater than or equal to 0", f.name)
		}
	}
	if _, err := nodePortsOnLoopback(cfg.NodePortAddresses); err != nil {
		return err
	}
	if cfg.NumCPU < 0 {
		return fmt.Errorf("nodesetup: Config.NumCPU: must be greater than or equal to 0")
	}
	return nil
}

// run makes (or plans) every setting in kube-proxy's order: the
// conntrack section (its platformSetup), then the mode's sysctls (its
// proxier constructor).
func (e *env) run(ctx context.Context, cfg Config) error {
	if err := e.conntrack(ctx, cfg.Conntrack); err != nil {
		return err
	}
	switch cfg.Mode {
	case "", "iptables":
		return e.iptables(ctx, cfg)
	case "ipvs":
		return e.ipvs(ctx, cfg)
	}
	// nftables: kube-proxy's nftables proxier sets no sysctl. ebpf: its
	// north-south rules are an nftables backend, and its socket
	// programs need no sysctl either.
	return nil
}

// conntrack is kube-proxy's conntrack.SetSysctls.
func (e *env) conntrack(ctx context.Context, c Conntrack) error {
	if m := ConntrackMax(c, e.numCPU); m > 0 {
		if err := e.conntrackMax(ctx, m); err != nil {
			return err
		}
	}
	// kube-proxy truncates timeouts to whole seconds.
	seconds := func(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }
	steps := []struct {
		on       bool
		key, val string
	}{
		{c.TCPEstablishedTimeout > 0, KeyTCPEstablishedTimeout, seconds(c.TCPEstablishedTimeout)},
		{c.TCPCloseWaitTimeout > 0, KeyTCPCloseWaitTimeout, seconds(c.TCPCloseWaitTimeout)},
		{c.TCPBeLiberal, KeyTCPBeLiberal, "1"},
		{c.UDPTimeout > 0, KeyUDPTimeout, seconds(c.UDPTimeout)},
		{c.UDPStreamTimeout > 0, KeyUDPStreamTimeout, seconds(c.UDPStreamTimeout)},
	}
	for _, s := range steps {
		if !s.on {
			continue
		}
		if err := e.ensure(ctx, s.key, s.val); err != nil {
			return err
		}
	}
	return nil
}

// conntrackMax sets nf_conntrack_max (written whenever it differs, so
// it may be lowered, as kube-proxy does) and raises the hash size to
// max/4 (never lowered). Both are host-global: outside the initial
// namespace nf_conntrack_max is read-only (it shows the host's value)
// and the hash size is a module parameter. There Apply changes neither
// and fails with [ErrHostGlobal] when either would need a change, where
// kube-proxy would fail writing nf_conntrack_max with EACCES, or change
// the host's hash size from inside the namespace.
func (e *env) conntrackMax(ctx context.Context, m int) error {
	want := strconv.Itoa(m)
	if !e.initial {
		if werr := e.sys.checkWrite(KeyConntrackMax); werr != nil {
			if errors.Is(werr, fs.ErrNotExist) {
				return e.fail(KeyConntrackMax, want, werr)
			}
			cur, err := e.sys.read(KeyConntrackMax)
			if err != nil {
				return e.fail(KeyConntrackMax, want, err)
			}
			if cur != want {
				return e.fail(KeyConntrackMax, want, fmt.Errorf("%w: read-only here (%v), and the host's value is %s", ErrHostGlobal, werr, cur))
			}
		}
		// A kernel that lets the namespace write it keeps it per
		// namespace: ensure below writes it.
	}
	if err := e.ensure(ctx, KeyConntrackMax, want); err != nil {
		return err
	}

	wantHash := m / 4
	cur, err := e.sys.read(HashsizePath)
	if err != nil {
		// kube-proxy fails here too.
		return e.fail(HashsizePath, "", err)
	}
	n, err := strconv.Atoi(cur)
	if err != nil {
		return e.fail(HashsizePath, "", fmt.Errorf("not a number: %q", cur))
	}
	if n >= wantHash {
		return nil
	}
	if !e.initial {
		return e.fail(HashsizePath, strconv.Itoa(wantHash), fmt.Errorf("%w: the host's hash size %d is below nf_conntrack_max/4", ErrHostGlobal, n))
	}
	if err := e.sys.checkWrite(HashsizePath); err != nil {
		// kube-proxy fails writing it (EROFS on a read-only /sys).
		return e.fail(HashsizePath, strconv.Itoa(wantHash), err)
	}
	return e.change(ctx, HashsizePath, cur, strconv.Itoa(wantHash))
}

// iptables is the part of kube-proxy's iptables proxier constructor that
// changes the node.
func (e *env) iptables(ctx context.Context, cfg Config) error {
	loop, _ := nodePortsOnLoopback(cfg.NodePortAddresses) // validated
	if !cfg.LocalhostNodePorts || !loop {
		return nil
	}
	e.log.InfoContext(ctx, "Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses")
	return e.ensure(ctx, KeyRouteLocalnet, "1")
}

// ipvs is the part of kube-proxy's ipvs proxier constructor that sets
// sysctls (its IPVS timeouts are not sysctls: the ipvs backend sets
// them).
func (e *env) ipvs(ctx context.Context, cfg Config) error {
	if err := e.ensure(ctx, KeyIPVSConntrack, "1"); err != nil {
		return err
	}
	maj, minor, ok := parseRelease(e.release)
	switch {
	case !ok:
		return e.fail(KeyIPVSConnReuseMode, "0", fmt.Errorf("failed to get kernel version: cannot parse %q", e.release))
	case maj < 4 || maj == 4 && minor < 1:
		e.log.ErrorContext(ctx, "Can't set sysctl, kernel version doesn't satisfy minimum version requirements",
			"sysctl", KeyIPVSConnReuseMode, "minimumKernelVersion", "4.1", "kernel", e.release)
	case maj > 5 || maj == 5 && minor >= 9:
		// Fixed in 5.9 (kubernetes#93297): left as it is.
		e.log.DebugContext(ctx, "Left as-is", "sysctl", KeyIPVSConnReuseMode)
	default:
		if err := e.ensure(ctx, KeyIPVSConnReuseMode, "0"); err != nil {
			return err
		}
	}
	kv := [][2]string{
		{KeyIPVSExpireNoDestConn, "1"},
		{KeyIPVSExpireQuiescentTemplate, "1"},
		{KeyIPForward, "1"},
	}
	if cfg.IPVSStrictARP {
		kv = append(kv, [2]string{KeyARPIgnore, "1"}, [2]string{KeyARPAnnounce, "2"})
	}
	for _, x := range kv {
		if err := e.ensure(ctx, x[0], x[1]); err != nil {
			return err
		}
	}
	return nil
}

// ensure is kube-proxy's EnsureSysctl: read, and write when the value
// differs or cannot be read. Plan fails where Apply certainly would: a
// file that cannot be read or written (access(2) says so).
func (e *env) ensure(ctx context.Context, key, want string) error {
	cur, rerr := e.sys.read(key)
	if rerr == nil && cur == want {
		return nil
	}
	if rerr != nil {
		if !e.apply || errors.Is(rerr, fs.ErrNotExist) {
			return e.fail(key, want, rerr)
		}
		cur = ""
	} else if err := e.sys.checkWrite(key); err != nil {
		return e.fail(key, want, fmt.Errorf("%w (the value is %s)", err, cur))
	}
	return e.change(ctx, key, cur, want)
}

// change writes (Apply) or records (Plan) one change.
func (e *env) change(ctx context.Context, key, old, val string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.apply {
		if err := e.sys.write(key, val); err != nil {
			return e.fail(key, val, err)
		}
	}
	e.changes = append(e.changes, Change{Key: key, Old: old, New: val})
	attrs := []any{"key", key, "old", old, "new", val}
	if e.netns != "" {
		attrs = append(attrs, "netns", e.netns)
	}
	if e.apply {
		e.log.InfoContext(ctx, "Changed node setting", attrs...)
	} else {
		e.log.DebugContext(ctx, "Would change node setting", attrs...)
	}
	return nil
}

func (e *env) fail(key, val string, err error) error {
	return &SettingError{Key: key, Value: val, NetNS: e.netns, Err: err}
}

// nodePortsOnLoopback is kube-proxy's NodePortAddresses(IPv4, addrs)
// .ContainsIPv4Loopback: whether IPv4 node ports open on 127.0.0.0/8.
// Without an IPv4 CIDR they open on every address, loopback included.
func nodePortsOnLoopback(addrs []string) (bool, error) {
	any4, loop := false, false
	for i, s := range addrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return false, fmt.Errorf("nodesetup: Config.NodePortAddresses[%d]: %q is not a CIDR (expand \"primary\" to the node's IPs first)", i, s)
		}
		if !p.Addr().Is4() {
			continue
		}
		any4 = true
		if p.Masked().Addr().IsLoopback() || p.Contains(netip.AddrFrom4([4]byte{127, 0, 0, 0})) {
			loop = true
		}
	}
	return !any4 || loop, nil
}

// parseRelease returns the major and minor version of a kernel release
// such as "6.1.0-18-amd64".
func parseRelease(r string) (maj, minor int, ok bool) {
	f := strings.FieldsFunc(r, func(c rune) bool { return c < '0' || c > '9' })
	if len(f) < 2 || !strings.HasPrefix(r, f[0]+".") {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(f[0])
	minor, err2 := strconv.Atoi(f[1])
	return maj, minor, err1 == nil && err2 == nil
}

// countCPUList counts the CPUs of a kernel CPU list such as "0-3,8,10-11";
// it returns 0 for a malformed list.
func countCPUList(s string) int {
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(s), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
