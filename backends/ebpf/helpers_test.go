package ebpf

import (
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/cgroup2"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// testSvc is a service port with its targets.
type testSvc = backendtest.Svc

// Short names for the builders the tests use most: svc is a cluster IP
// service port balancing to endpoints (none: no endpoints at all).
var (
	svc     = backendtest.ClusterSvcAt
	eps     = backendtest.EndpointsAt
	request = backendtest.Request
)

func mustSync(tb testing.TB, b proxier.Backend, req *proxier.SyncRequest) {
	tb.Helper()
	if err := b.Sync(tb.Context(), req); err != nil {
		tb.Fatalf("sync: %+v", err)
	}
}

// emptyCgroup creates a cgroup v2 directory of the test's own, with no
// process in it, removed at the end: programs attached there run for
// nobody, which is all a benchmark of map writes needs.
func emptyCgroup(tb testing.TB) string {
	tb.Helper()
	testnet.RequireRoot(tb)
	if _, err := cgroup2.Mount(); err != nil {
		tb.Skipf("needs cgroup v2: %v", err)
	}
	dir, err := cgroup2.Create("proxykit-ebpf-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			tb.Errorf("remove cgroup: %v", err)
		}
	})
	return dir
}

// newCgroup creates a cgroup v2 directory of the test's own and moves
// the whole test process into it, so that the sockets of every client
// the test runs (in any namespace) pass the programs attached there. At
// the end the process moves back and the cgroup is removed. Tests that
// call it must not run in parallel with each other.
func newCgroup(tb testing.TB) string {
	tb.Helper()
	testnet.RequireRoot(tb)
	if _, err := cgroup2.Mount(); err != nil {
		tb.Skipf("needs cgroup v2: %v", err)
	}
	dir, leave, err := cgroup2.Enter("proxykit-ebpf-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := leave(); err != nil {
			tb.Error(err)
		}
	})
	return dir
}

// bpffs mounts a bpffs of the test's own and returns its directory.
func bpffs(tb testing.TB) string {
	tb.Helper()
	return testnet.BPFFS(tb)
}

// attachedPrograms returns the ids of the programs attached to a cgroup,
// over every hook the backend uses.
func attachedPrograms(tb testing.TB, cgroup string) []ebpf.ProgramID {
	tb.Helper()
	var ids []ebpf.ProgramID
	for _, h := range hooks() {
		got, err := cgroupPrograms(cgroup, h.attach)
		if err != nil {
			tb.Fatalf("query %s: %v", h.name, err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// pinned lists the files of a pin directory.
func pinned(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range es {
		// bpffs shows the kernel's own iterators as files.
		if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
			out = append(out, e.Name())
		}
	}
	return out
}

// podPaths returns the namespace paths of node1's pods.
func podPaths(tn *testnet.Topology) []string {
	var out []string
	for _, p := range tn.Node1.Pods {
		out = append(out, p.Path())
	}
	return out
}

// vip returns a cluster IP of family f: 10.96.0.x or fd00:10:96::x.
func vip(f model.IPFamily, x byte) netip.Addr {
	if f == model.IPv6 {
		return netip.AddrFrom16([16]byte{0: 0xfd, 3: 0x10, 5: 0x96, 15: x})
	}
	return netip.AddrFrom4([4]byte{10, 96, 0, x})
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func fams() []model.IPFamily { return []model.IPFamily{model.IPv4, model.IPv6} }
