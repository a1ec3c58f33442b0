package testnet

import (
	"testing"

	"golang.org/x/sys/unix"
)

// BPFFS mounts a bpffs of the test's own in a temporary directory, for
// the eBPF backend's Config.PinPath, and returns the directory; it is
// unmounted at the end of the test (after cleanups registered later,
// such as one that removes what a proxier pinned there). Call
// [RequireRoot] first.
func BPFFS(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		tb.Fatalf("mount bpffs: %v", err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount bpffs: %v", err)
		}
	})
	return dir
}
