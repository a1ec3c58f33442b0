//go:build linux

package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Open opens the network namespace at path (e.g. /var/run/netns/x or
// /proc/PID/ns/net). An empty path means the caller's own namespace.
func Open(path string) (*NS, error) {
	if path == "" {
		return &NS{}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		f.Close()
		return nil, fmt.Errorf("network namespace %s: not a namespace file", path)
	}
	return &NS{path: path, f: f}, nil
}

// ID returns the device and inode numbers that identify the namespace:
// two handles of one namespace, opened from any paths, have the same.
func (n *NS) ID() (dev, ino uint64, err error) {
	var st unix.Stat_t
	if n.f == nil {
		err = unix.Stat("/proc/self/ns/net", &st)
	} else {
		err = unix.Fstat(int(n.f.Fd()), &st)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("network namespace: %w", err)
	}
	return st.Dev, st.Ino, nil
}

// NetlinkHandle returns a route netlink handle in the namespace. The caller
// closes it with Close (Delete).
func (n *NS) NetlinkHandle(families ...int) (*netlink.Handle, error) {
	if len(families) == 0 {
		families = []int{unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER}
	}
	if n.f == nil {
		return netlink.NewHandle(families...)
	}
	return netlink.NewHandleAt(vnetns.NsHandle(n.Fd()), families...)
}

// Do runs fn on a dedicated OS thread inside the namespace and returns its
// error. For the caller's own namespace fn runs on a locked thread too, so
// fn may rely on that.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if n.f == nil {
			defer runtime.UnlockOSThread()
			errc <- fn()
			return
		}
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", n.path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked so the runtime terminates it
			// when this goroutine exits, instead of handing it to other
			// goroutines in the wrong namespace. (Do always runs fn on a
			// fresh goroutine, never on the main thread, which the
			// runtime would park forever instead.)
			errc <- fmt.Errorf("return from network namespace %s: %w", n.path, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// SetSysctl sets the network sysctl key (a path below /proc/sys, e.g.
// "net/ipv4/conf/all/route_localnet") to value in the namespace. It
// writes only when the value differs and reports whether it wrote.
func (n *NS) SetSysctl(key, value string) (changed bool, err error) {
	err = n.Do(func() error {
		// /proc/sys/net resolves against the calling thread's namespace.
		p := filepath.Join("/proc/sys", key)
		if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == value {
			return nil
		}
		if err := os.WriteFile(p, []byte(value), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
		}
		changed = true
		return nil
	})
	return changed, err
}
