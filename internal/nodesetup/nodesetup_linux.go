//go:build linux

package nodesetup

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
)

// Apply makes the settings of cfg in cfg.NetNS, in kube-proxy's order,
// writing only what differs. It logs each change at Info (key, old,
// new) and returns them. A setting it cannot make stops it with a
// [*SettingError] naming the setting and why (kube-proxy fails on every
// one of these too); the changes made before it are returned with it. A
// host-global setting that would need a change from a namespace other
// than the initial one fails with an error matching [ErrHostGlobal]. A
// bad cfg (unknown Mode, a negative value, a NodePortAddresses entry that
// is not a CIDR) or a bad NetNS fails before anything is read.
func Apply(ctx context.Context, cfg Config) ([]Change, error) {
	return run(ctx, cfg, true)
}

// Plan returns what Apply would change, changing nothing (for --dry-run
// and --init-only reports). It fails where Apply would certainly fail:
// a setting whose file is missing or read-only, or a host-global one
// outside the initial namespace ([ErrHostGlobal]).
func Plan(ctx context.Context, cfg Config) ([]Change, error) {
	return run(ctx, cfg, false)
}

func run(ctx context.Context, cfg Config, apply bool) ([]Change, error) {
	if err := validate(cfg); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("nodesetup: %w", err)
	}
	defer ns.Close()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, fmt.Errorf("nodesetup: kernel version: %w", err)
	}
	e := &env{
		sys:     procSys{},
		netns:   cfg.NetNS,
		initial: initialNS(ns),
		numCPU:  cfg.NumCPU,
		release: unix.ByteSliceToString(uts.Release[:]),
		apply:   apply,
		log:     cfg.Logger,
	}
	if e.numCPU == 0 {
		e.numCPU = numCPU()
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	// /proc/sys/net resolves against the reading thread's namespace, so
	// the whole run happens on a thread inside the namespace.
	err = ns.Do(func() error { return e.run(ctx, cfg) })
	return e.changes, err
}

// initialNS reports whether ns is the initial network namespace, the one
// of PID 1. When that cannot be told (no access to PID 1's namespace)
// it answers false, so host-global settings are left alone.
func initialNS(ns *netns.NS) bool {
	dev, ino, err := ns.ID()
	if err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/1/ns/net", &st); err != nil {
		return false
	}
	return st.Dev == dev && st.Ino == ino
}

// numCPU counts the online CPUs listed in /sys/devices/system/cpu/online
// (like cadvisor's topology, which kube-proxy reads, it is not limited
// by this process's CPU affinity), or returns runtime.NumCPU.
func numCPU() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	if n := countCPUList(string(b)); n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// procSys reads and writes files from a thread inside the target
// namespace: keys below /proc/sys are the namespace's sysctls, absolute
// paths are host files.
type procSys struct{}

func sysPath(key string) string {
	if filepath.IsAbs(key) {
		return key
	}
	return filepath.Join("/proc/sys", key)
}

func (procSys) read(key string) (string, error) {
	b, err := os.ReadFile(sysPath(key))
	return strings.TrimSpace(string(b)), err
}

func (procSys) write(key, value string) error {
	f, err := os.OpenFile(sysPath(key), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkWrite asks access(2) with the effective IDs: for a sysctl it
// applies the kernel's own permission (read-only ones fail with EACCES,
// also for root), for any file a read-only mount fails with EROFS.
func (procSys) checkWrite(key string) error {
	p := sysPath(key)
	if err := unix.Faccessat(unix.AT_FDCWD, p, unix.W_OK, unix.AT_EACCESS); err != nil {
		return &fs.PathError{Op: "access", Path: p, Err: err}
	}
	return nil
}
