package netns

import "os"

// NS is an open network namespace. The zero value and nil are not valid;
// use [Open]. An NS opened with an empty path stands for the caller's own
// namespace.
type NS struct {
	path string
	f    *os.File // nil for the caller's own namespace
}

// Path returns the path the namespace was opened from; empty for the
// caller's own.
func (n *NS) Path() string { return n.path }

// Own reports whether n is the caller's own namespace.
func (n *NS) Own() bool { return n.f == nil }

// Fd returns the namespace's file descriptor, or -1 for the caller's own.
func (n *NS) Fd() int {
	if n.f == nil {
		return -1
	}
	return int(n.f.Fd())
}

// Close closes the namespace file. The namespace itself is not touched.
func (n *NS) Close() error {
	if n.f == nil {
		return nil
	}
	return n.f.Close()
}
