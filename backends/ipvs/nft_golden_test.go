package ipvs

import (
	"flag"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// Golden tests of the backend's nftables table: the batches it sends for
// a small fixed state, recorded without a kernel (no root, no namespace)
// and compared with testdata/*.golden. Rewrite them with
//
//	go test ./backends/ipvs/ -run Golden -update

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files")

// goldenIPVSState is a cluster IP with endpoints, a node port, an
// external IP with policy Local and no local endpoint, a service without
// endpoints, and a load-balancer IP with source ranges.
func goldenIPVSState() []svc {
	web := clusterSvc("web", model.TCP, "10.96.0.10", 80, "10.0.1.2:8080", "10.0.2.2:8080")
	np := clusterSvc("nodeport", model.UDP, "10.96.0.11", 53, "10.0.1.3:5353")
	np.Port.NodePort = 30053
	local := clusterSvc("local", model.TCP, "10.96.0.12", 80, "10.0.2.4:8080")
	local.Port.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.10")}
	local.Port.ExternalPolicy = model.PolicyLocal
	local = local.WithTargets(local.Targets.Internal, nil, true)
	empty := clusterSvc("empty", model.SCTP, "10.96.0.14", 9000)
	lb := clusterSvc("lb", model.TCP, "10.96.0.15", 443, "10.0.1.6:8443")
	lb.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	lb.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	return []svc{web, np, local, empty, lb}
}

func TestGoldenNftTable(t *testing.T) {
	cfg := Config{}.WithDefaults()
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}
	fi := newFamily(model.IPv4, cfg.TableName)
	rec := nftnl.NewRecorder()
	n := &nftConn{c: rec}
	log := slog.New(slog.DiscardHandler)
	r := testRenderer(model.IPv4, "192.168.0.10")

	// First full sync: the table does not exist.
	svcs := goldenIPVSState()
	st := newState()
	planState(st, request(model.IPv4, svcs), r, false)
	elems := slices.SortedFunc(maps.Keys(st.elems), compareElems)
	if err := n.replaceTable(&fi, &cfg, elems, log); err != nil {
		t.Fatal(err)
	}
	// An incremental sync: a service port added.
	added := clusterSvc("added", model.TCP, "10.96.0.16", 8080, "10.0.2.7:80")
	svcs = append(svcs, added)
	c := planState(st, request(model.IPv4, svcs, backendtest.Names(added)...), r, true)
	if err := n.updateElems(&fi, c.addElems, false); err != nil {
		t.Fatal(err)
	}
	if err := n.updateElems(&fi, c.delElems, true); err != nil {
		t.Fatal(err)
	}
	// A later full sync (a restart) refills the table in place.
	full := newState()
	planState(full, request(model.IPv4, svcs), r, false)
	if err := n.replaceTable(&fi, &cfg, slices.SortedFunc(maps.Keys(full.elems), compareElems), log); err != nil {
		t.Fatal(err)
	}
	b := rec.Batches()
	if len(b) != 3 {
		t.Fatalf("%d batches, want 3", len(b))
	}
	got := "# first full sync\n" + b[0] +
		"\n# incremental sync: " + added.Port.Name.String() + " added\n" + b[1] +
		"\n# full sync of a table that exists: refilled in place\n" + b[2]

	// What the virtual server set records is what the state holds.
	keys, err := n.virtualServers(&fi)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.SortedFunc(maps.Keys(full.vs), compareKeys); !slices.Equal(keys, want) {
		t.Errorf("virtual servers read back %v, want %v", keys, want)
	}

	path := filepath.Join("testdata", "nft-ipv4.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s differs (-want +got; run with -update to accept):\n%s", path, d)
	}
}

// TestNftCleanupDeletesTable: deleting the table works whether or not it
// exists, and leaves no table.
func TestNftCleanupDeletesTable(t *testing.T) {
	cfg := Config{}.WithDefaults()
	fi := newFamily(model.IPv6, cfg.TableName)
	rec := nftnl.NewRecorder()
	n := &nftConn{c: rec}
	for range 2 {
		if err := n.deleteTable(fi.table); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.replaceTable(&fi, &cfg, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if err := n.deleteTable(fi.table); err != nil {
		t.Fatal(err)
	}
	if s := rec.List(fi.table.proto, fi.table.name); s != "" {
		t.Errorf("table left:\n%s", s)
	}
	if !strings.HasPrefix(rec.Last(), "add table ip6 proxykit-ipvs\ndelete table ip6 proxykit-ipvs\n") {
		t.Errorf("deletion batch:\n%s", rec.Last())
	}
}
