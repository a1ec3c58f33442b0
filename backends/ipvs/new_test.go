package ipvs

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestNewWithoutIPVS checks, on a kernel without IPVS, that New fails
// with an error naming it and matching proxier.ErrNotSupported.
func TestNewWithoutIPVS(t *testing.T) {
	if haveIPVS() {
		t.Skip("this kernel has IPVS; the kernel tests cover New")
	}
	// A namespace of its own, so that nothing is ever probed in the
	// host's (modprobe might load IPVS after all).
	path, release := scratchNetNS(t)
	defer release()
	b, err := NewBackend(Config{Config: proxier.Config{NetNS: path}}, model.IPv4)
	if err == nil {
		b.Close()
		// modprobe loaded it after all.
		if haveIPVS() {
			t.Skip("IPVS was loaded on demand")
		}
		t.Fatal("NewBackend succeeded without IPVS")
	}
	var ue *proxier.UnsupportedError
	if !errors.Is(err, proxier.ErrNotSupported) || !errors.As(err, &ue) || ue.What != "IPVS (ip_vs)" {
		t.Errorf("error %v (%T); want an *UnsupportedError for IPVS matching ErrNotSupported", err, err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{Scheduler: "nope"}); err == nil {
		t.Error("New accepted an unknown scheduler")
	}
	if _, err := NewBackend(Config{}, 5); err == nil {
		t.Error("NewBackend accepted family 5")
	}
}

// scratchNetNS returns the path of a new, empty network namespace held by
// a locked thread until release is called (the thread then exits with it).
// Without the privilege to create one (not root) it returns "": the
// caller's own namespace, where an unprivileged process can change
// nothing anyway.
func scratchNetNS(t *testing.T) (path string, release func()) {
	t.Helper()
	ready := make(chan string)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ready <- ""
			return
		}
		ready <- fmt.Sprintf("/proc/%d/task/%d/ns/net", unix.Getpid(), unix.Gettid())
		<-done
	}()
	path = <-ready
	return path, func() { close(done) }
}
