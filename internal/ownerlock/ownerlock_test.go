package ownerlock

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/testnet"
)

// TestAcquire checks that a second holder is refused with ErrHeld until
// the first releases, in this process and across processes, and that
// objects and namespaces do not collide.
func TestAcquire(t *testing.T) {
	testnet.RequireRoot(t)
	ns, err := netns.Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	object := "test " + t.Name() + " " + strings.Repeat("x", 3)
	a, err := Acquire(ns, object)
	if err != nil || a == nil {
		t.Fatalf("first Acquire: %v, %v", a, err)
	}
	if _, err := Acquire(ns, object); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "this process") {
		t.Fatalf("second Acquire in the process: %v; want ErrHeld naming this process", err)
	}
	other, err := Acquire(ns, object+" other")
	if err != nil {
		t.Fatalf("another object: %v", err)
	}
	other.Release()
	// Another process (flock(1)) is refused too while a holds the lock.
	if _, err := exec.LookPath("flock"); err == nil {
		matches, _ := findLock(object)
		if len(matches) != 1 {
			t.Fatalf("lock files for %q: %v", object, matches)
		}
		if out, err := exec.Command("flock", "-n", matches[0], "true").CombinedOutput(); err == nil {
			t.Errorf("another process took the held lock: %s", out)
		}
	}
	a.Release()
	a.Release()
	b, err := Acquire(ns, object)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	b.Release()
}

func findLock(object string) ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "-"+sanitize(object)+".lock") {
			out = append(out, Dir+"/"+e.Name())
		}
	}
	return out, nil
}
