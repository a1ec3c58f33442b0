package ownerlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
)

// Dir is where the lock files are.
const Dir = "/run/proxykit"

// Lock is a held lock. Release it with Release.
type Lock struct{ f *os.File }

// ErrHeld is returned (wrapped) by [Acquire] when a live proxier holds
// the lock.
var ErrHeld = errors.New("held by a running proxier")

// Acquire takes the lock on object (e.g. "nftables ip proxykit") in ns.
// It fails at once, wrapping [ErrHeld] and naming the holder's process,
// when another holder has it. When the lock directory cannot be written
// (no privileges, a read-only /run) it returns a nil Lock and nil error:
// such a caller could not program the namespace either.
func Acquire(ns *netns.NS, object string) (*Lock, error) {
	dev, ino, err := ns.ID()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%d-%d-%s.lock", dev, ino, sanitize(object))
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			return nil, nil
		}
		return nil, fmt.Errorf("ownerlock: %w", err)
	}
	path := filepath.Join(Dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EROFS) {
			return nil, nil
		}
		return nil, fmt.Errorf("ownerlock: %w", err)
	}
	if err := flock(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s in network namespace %s: %w (%s; lock %s)", object, nsName(ns), ErrHeld, describe(holder), path)
		}
		return nil, fmt.Errorf("ownerlock: lock %s: %w", path, err)
	}
	// Say who holds it, for the error of the next one that tries.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+strings.Join(os.Args, " ")+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// heldGrace is how long Acquire keeps trying a lock that is held. A
// released lock can stay held for a moment: a child that this process is
// forking holds a copy of the file until it execs, and the lock goes
// with the last copy. A live holder keeps it for good.
const heldGrace = 2 * time.Second

// flock takes an exclusive lock on f, waiting up to heldGrace.
func flock(f *os.File) error {
	deadline := time.Now().Add(heldGrace)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Release gives the lock up. It is safe on a nil Lock and more than once.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
}

// sanitize makes object usable in a file name.
func sanitize(object string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, object)
}

func nsName(ns *netns.NS) string {
	if ns.Own() {
		return "(the caller's own)"
	}
	return ns.Path()
}

func describe(holder []byte) string {
	pid, cmd, _ := strings.Cut(strings.TrimSpace(string(holder)), " ")
	if pid == "" {
		return "holder unknown"
	}
	if pid == strconv.Itoa(os.Getpid()) {
		return "by another proxier of this process"
	}
	return fmt.Sprintf("by process %s: %s", pid, cmd)
}
