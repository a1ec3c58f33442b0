//go:build !linux

package netns

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
)

// ErrNotLinux is the error of what needs Linux's network namespaces.
var ErrNotLinux = errors.New("network namespaces need Linux")

// Open returns the caller's own namespace for an empty path; any other
// path is an error off Linux.
func Open(path string) (*NS, error) {
	if path == "" {
		return &NS{}, nil
	}
	return nil, fmt.Errorf("open network namespace %s: %w", path, ErrNotLinux)
}

// ID fails off Linux.
func (n *NS) ID() (dev, ino uint64, err error) { return 0, 0, ErrNotLinux }

// NetlinkHandle fails off Linux.
func (n *NS) NetlinkHandle(families ...int) (*netlink.Handle, error) { return nil, ErrNotLinux }

// Do runs fn on a locked OS thread (there is only the caller's own
// namespace off Linux).
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		errc <- fn()
	}()
	return <-errc
}

// SetSysctl fails off Linux.
func (n *NS) SetSysctl(key, value string) (changed bool, err error) {
	return false, fmt.Errorf("sysctl %s: %w", key, ErrNotLinux)
}
