package cgroup2

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

func TestEnterAndLeave(t *testing.T) {
	testnet.RequireRoot(t)
	mount, err := Mount()
	if err != nil {
		t.Fatalf("no cgroup v2 here: %v", err)
	}
	before, err := Own(mount)
	if err != nil {
		t.Fatal(err)
	}
	dir, leave, err := Enter("proxykit-cgroup2-test-")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != mount {
		t.Errorf("cgroup %s not directly under %s", dir, mount)
	}
	if now, err := Own(mount); err != nil || now != dir {
		t.Errorf("after Enter the process is in %q (%v), want %q", now, err, dir)
	}
	if err := leave(); err != nil {
		t.Fatal(err)
	}
	if now, err := Own(mount); err != nil || now != before {
		t.Errorf("after leave the process is in %q (%v), want %q", now, err, before)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still exists (%v)", dir, err)
	}
}
