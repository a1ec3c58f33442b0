package testnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
)

// NetNSDir is where the harness bind-mounts its namespaces, as `ip netns`
// does.
const NetNSDir = "/var/run/netns"

// NS is a network namespace created by the harness. Its methods are safe
// for concurrent use.
type NS struct {
	name string
	path string
	ns   *netns.NS
	ino  uint64
	topo *Topology

	mu      sync.Mutex
	closers []io.Closer // client sockets handed out, closed at teardown
	closed  bool
}

// Name returns the namespace's name, e.g. pk-1a2b3c4d-node1.
func (n *NS) Name() string { return n.name }

// Path returns the namespace's path, e.g. /var/run/netns/pk-1a2b3c4d-node1,
// the value a proxier.Config.NetNS takes.
func (n *NS) Path() string { return n.path }

// String returns the namespace's name.
func (n *NS) String() string { return n.name }

// Do runs fn on a locked OS thread inside the namespace (see
// internal/netns). Sockets fn creates live in the namespace and may be used
// from any goroutine afterwards.
func (n *NS) Do(fn func() error) error { return n.ns.Do(fn) }

// Exec runs a program inside the namespace and returns its standard
// output. A failure's error carries the standard error.
func (n *NS) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return n.ExecInput(ctx, "", name, args...)
}

// ExecInput is [NS.Exec] with input as the program's standard input, e.g.
// a rule set for `nft -f -`.
func (n *NS) ExecInput(ctx context.Context, input, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := n.Do(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdin = strings.NewReader(input)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		// The child is forked from this locked thread, so it starts in
		// the namespace.
		return cmd.Run()
	})
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// SetSysctl writes a sysctl of the namespace; key is a path below
// /proc/sys, e.g. "net/ipv4/ip_forward".
func (n *NS) SetSysctl(key, value string) error {
	return n.Do(func() error {
		// /proc/sys/net resolves against the opening thread's namespace.
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0)
	})
}

// Sysctl reads a sysctl of the namespace; key is as for [NS.SetSysctl].
func (n *NS) Sysctl(key string) (string, error) {
	var v []byte
	err := n.Do(func() error {
		var err error
		v, err = os.ReadFile(filepath.Join("/proc/sys", key))
		return err
	})
	return strings.TrimSpace(string(v)), err
}

// netlink returns a route netlink handle whose socket lives in the
// namespace. The caller closes it.
func (n *NS) netlink() (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	return h, err
}

// track registers c to be closed when the namespace is torn down. It
// returns false, having closed c, when the namespace is already gone.
func (n *NS) track(c io.Closer) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		c.Close()
		return false
	}
	n.closers = append(n.closers, c)
	return true
}

// closeTracked closes every tracked client socket.
func (n *NS) closeTracked() {
	n.mu.Lock()
	cs := n.closers
	n.closers, n.closed = nil, true
	n.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// shareNetNSDir makes NetNSDir a mount point with shared propagation, as
// `ip netns add` does, before the first namespace is mounted in it.
//
// Otherwise two things keep a namespace's mount alive after its
// unmount, and removing its file fails with EBUSY: a process that runs
// in a mount namespace of its own (`ip netns exec` makes one) holds a
// private copy of every mount under the directory, and `ip netns add`
// turns the directory into a bind mount of itself, which hides, but
// keeps, every namespace mounted before. Both happen when other tests
// run beside these ones, and more often under load, when such processes
// live longer. With shared propagation an unmount reaches the copies,
// and `ip netns add` finds the directory already prepared.
//
// A lock file serialises the check between test processes.
func shareNetNSDir() error {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(NetNSDir), ".proxykit-netns.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	err = unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		return err // done, or a real failure
	}
	// Not a mount point yet: make it one, then shared.
	if err := unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s on itself: %w", NetNSDir, err)
	}
	if err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", NetNSDir, err)
	}
	return nil
}

// createNS creates a network namespace bind-mounted at NetNSDir/name.
func createNS(name string) (*NS, error) {
	if err := shareNetNSDir(); err != nil {
		return nil, fmt.Errorf("create namespace %s: prepare %s: %w", name, NetNSDir, err)
	}
	path := filepath.Join(NetNSDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		merr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		// Return to the original namespace. Merely ending a locked
		// goroutine is not enough: on the main thread (m0) the runtime
		// parks the thread forever instead of ending it, which would
		// keep the namespace alive. If returning fails the thread stays
		// locked and ends (or parks) with this goroutine.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(merr, fmt.Errorf("return to original namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		if merr != nil {
			merr = fmt.Errorf("bind mount: %w", merr)
		}
		errc <- merr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	h, err := netns.Open(path)
	if err != nil {
		removeNS(path)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.Fd(), &st); err != nil {
		h.Close()
		removeNS(path)
		return nil, err
	}
	return &NS{name: name, path: path, ns: h, ino: st.Ino}, nil
}

// destroy closes the namespace's tracked sockets and handle and removes
// its mount. The kernel frees the namespace once nothing else refers to it.
func (n *NS) destroy() error {
	n.closeTracked()
	err := n.ns.Close()
	return errors.Join(err, removeNS(n.path))
}

func removeNS(path string) error {
	var errs []error
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
