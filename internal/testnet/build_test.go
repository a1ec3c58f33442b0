package testnet_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestBuildDetach checks the entry point for programs: Build makes a
// working topology without a testing.TB, Detach leaves its namespaces in
// place (and Close after it does nothing), RemoveNamespaces removes them.
func TestBuildDetach(t *testing.T) {
	testnet.RequireRoot(t)
	tp, err := testnet.Build(testnet.Options{Node1Pods: 1, Node2Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	glob := func() []string {
		m, _ := filepath.Glob(filepath.Join(testnet.NetNSDir, "pk-"+tp.ID+"-*"))
		return m
	}
	t.Cleanup(func() {
		tp.Close()
		testnet.RemoveNamespaces(tp.ID)
	})
	expect(t, "client->pod", tp.Client.TCP(ap(tp.Pods[1].IPv4, 8080), timeout), "tcp", tp.Pods[1].Name, 8080, tp.Client.IPv4)
	if _, err := tp.Client.UDPSocket(ap(tp.Pods[0].IPv4, 8080)); err != nil {
		t.Fatal(err)
	}
	if err := tp.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if n := len(glob()); n != 6 {
		t.Fatalf("after Detach %d namespaces, want 6", n)
	}
	if err := tp.Close(); err != nil {
		t.Errorf("Close after Detach: %v", err)
	}
	if n := len(glob()); n != 6 {
		t.Fatalf("Close after Detach removed namespaces: %d left", n)
	}
	names, err := testnet.RemoveNamespaces(tp.ID)
	if err != nil || len(names) != 6 {
		t.Errorf("RemoveNamespaces: %v, %v", names, err)
	}
	if left := glob(); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
	for _, bad := range []string{"", "*", "../x"} {
		if _, err := testnet.RemoveNamespaces(bad); err == nil {
			t.Errorf("RemoveNamespaces(%q) accepted", bad)
		}
	}
}

// TestBuildInvalid checks that Build reports bad options as an error.
func TestBuildInvalid(t *testing.T) {
	testnet.RequireRoot(t)
	if _, err := testnet.Build(testnet.Options{Node1Pods: 201}); err == nil || !strings.Contains(err.Error(), "invalid pod counts") {
		t.Errorf("Build with 201 pods: %v", err)
	}
}
