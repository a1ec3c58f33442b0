package nftables

import (
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Golden tests: the batches the backend sends for a small fixed state,
// recorded without a kernel (no root, no namespace) and compared with
// testdata/*.golden. Rewrite them with
//
//	go test ./backends/nftables/ -run Golden -update

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files")

// recordedBackend returns a backend of family f that writes to a
// recorder instead of the kernel.
func recordedBackend(t *testing.T, f model.IPFamily, cfg Config) (*backend, *nftnl.Recorder) {
	t.Helper()
	cfg = cfg.WithDefaults()
	cfg.Logger = slog.New(slog.DiscardHandler)
	rec := nftnl.NewRecorder()
	b, err := newBackend(cfg, f, &conn{rec})
	if err != nil {
		t.Fatal(err)
	}
	return b, rec
}

// goldenState is the fixed state of the golden tests, in family f: a
// cluster IP, a node port, an external IP with policy Local, session
// affinity and a service without endpoints.
func goldenState(f model.IPFamily) []testSvc {
	a := func(v4, v6 string) string {
		if f == model.IPv6 {
			return v6
		}
		return v4
	}
	ep := func(v4, v6 string, port uint16) string {
		return netip.AddrPortFrom(netip.MustParseAddr(a(v4, v6)), port).String()
	}
	web := clusterSvc("web", model.TCP, a("10.96.0.10", "fd00:96::10"), 80,
		ep("10.0.1.2", "fd00:1::2", 8080), ep("10.0.2.2", "fd00:2::2", 8080))
	np := clusterSvc("nodeport", model.TCP, a("10.96.0.11", "fd00:96::11"), 80, ep("10.0.1.3", "fd00:1::3", 8080))
	np.Port.NodePort = 30080
	local := clusterSvc("local", model.TCP, a("10.96.0.12", "fd00:96::12"), 80,
		ep("10.0.1.4", "fd00:1::4", 8080), ep("10.0.2.4", "fd00:2::4", 8080))
	local.Port.ExternalIPs = []netip.Addr{netip.MustParseAddr(a("203.0.113.10", "2001:db8::10"))}
	local.Port.ExternalPolicy = model.PolicyLocal
	local = local.WithTargets(local.Targets.Internal, backendtest.Endpoints(ep("10.0.1.4", "fd00:1::4", 8080)), true)
	sticky := clusterSvc("sticky", model.TCP, a("10.96.0.13", "fd00:96::13"), 443,
		ep("10.0.1.5", "fd00:1::5", 8443), ep("10.0.2.5", "fd00:2::5", 8443))
	sticky.Port.SessionAffinity = true
	sticky.Port.AffinityTimeout = 10 * time.Minute
	empty := clusterSvc("empty", model.UDP, a("10.96.0.14", "fd00:96::14"), 53)
	return []testSvc{web, np, local, sticky, empty}
}

// goldenConfig is the configuration of the golden tests, in family f.
func goldenConfig(f model.IPFamily, table string) Config {
	cidr := "10.0.0.0/16"
	if f == model.IPv6 {
		cidr = "fd00::/48"
	}
	return Config{Config: proxier.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}, TableName: table}
}

// recordSyncs runs the first full sync of the golden state and an
// incremental one that adds an endpoint to default/web, and returns the
// batches as text.
func recordSyncs(t *testing.T, f model.IPFamily, cfg Config) string {
	t.Helper()
	b, rec := recordedBackend(t, f, cfg)
	svcs := goldenState(f)
	serviceCIDR := netip.MustParsePrefix("10.96.0.0/16")
	added := "10.0.3.2:8080"
	if f == model.IPv6 {
		serviceCIDR, added = netip.MustParsePrefix("fd00:96::/112"), "[fd00:3::2]:8080"
	}
	req := request(f, svcs, nil)
	req.ServiceCIDRs = []netip.Prefix{serviceCIDR}
	mustSync(t, b, req)
	svcs[0] = svcs[0].WithAdded(backendtest.Endpoint(added))
	req = request(f, svcs, backendtest.Names(svcs[0]))
	req.ServiceCIDRs = []netip.Prefix{serviceCIDR}
	mustSync(t, b, req)
	if b.last.full {
		t.Fatal("the second sync was a full one")
	}
	batches := rec.Batches()
	if len(batches) != 2 {
		t.Fatalf("%d batches, want 2", len(batches))
	}
	return "# first full sync\n" + batches[0] +
		"\n# incremental sync: endpoint " + added + " added to " + svcs[0].Port.Name.String() + "\n" + batches[1]
}

// checkGolden compares got with testdata/name, or rewrites it with -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
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

func TestGoldenSyncs(t *testing.T) {
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			got := recordSyncs(t, f, goldenConfig(f, DefaultTableName))
			checkGolden(t, "syncs-"+strings.ToLower(f.String())+".golden", got)
		})
	}
}

// TestGoldenEBPFNorthSouth: the eBPF backend's north-south table is this
// backend under the eBPF backend's table name (backends/ebpf builds it
// with nftables.Config{Config: cfg.Config, TableName: cfg.TableName}).
func TestGoldenEBPFNorthSouth(t *testing.T) {
	const ebpfTable = "proxykit-ebpf" // ebpf.DefaultTableName
	cfg := goldenConfig(model.IPv4, ebpfTable)
	got := recordSyncs(t, model.IPv4, Config{Config: cfg.Config, TableName: ebpfTable})
	checkGolden(t, "ebpf-north-south-ipv4.golden", got)
}

// TestRecordedResyncInPlace: a later full sync keeps the table and its
// affinity sets, flushes and refills the rest, and deletes the chain of
// a service port that went away.
func TestRecordedResyncInPlace(t *testing.T) {
	b, rec := recordedBackend(t, model.IPv4, goldenConfig(model.IPv4, DefaultTableName))
	svcs := goldenState(model.IPv4)
	mustSync(t, b, request(model.IPv4, svcs, nil))
	svcs = svcs[:3] // sticky (with a chain of its own) and empty go
	mustSync(t, b, request(model.IPv4, svcs, nil))
	text := rec.Last()
	for _, want := range []string{
		"flush chain ip proxykit services\n",
		"delete chain ip proxykit svc-default/sticky/tcp\n",
		"flush set ip proxykit service-ips\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("resync lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "flush set ip proxykit affinity-") {
		t.Errorf("resync flushed an affinity set:\n%s", text)
	}
	// What the model holds afterwards: nothing of the ports that went.
	table := rec.List(b.fi.proto, b.cfg.TableName)
	for _, gone := range []string{"sticky", "10.96.0.13", "10.96.0.14"} {
		if strings.Contains(table, gone) {
			t.Errorf("table still holds %s:\n%s", gone, table)
		}
	}
	if !strings.Contains(table, "10.96.0.10 . tcp . 80 : goto cluster-") {
		t.Errorf("table lost default/web:\n%s", table)
	}
}

// TestRecordedRejectionSkipsService: a message the kernel rejects is
// traced to its service port, which is left out and reported, and the
// batch is sent again without it.
func TestRecordedRejectionSkipsService(t *testing.T) {
	b, rec := recordedBackend(t, model.IPv4, goldenConfig(model.IPv4, DefaultTableName))
	rec.Reject = func(m *nftnl.Message) unix.Errno {
		if m.Type == unix.NFT_MSG_NEWRULE && m.Name == "svc-default/sticky/tcp" {
			return unix.EINVAL
		}
		return 0
	}
	err := b.Sync(t.Context(), request(model.IPv4, goldenState(model.IPv4), nil))
	var oe *proxier.ObjectError
	if !errorsAs(err, &oe) || oe.Service.Name != "sticky" {
		t.Fatalf("sync error %v, want an ObjectError for sticky", err)
	}
	if _, ok := b.st.services[oe.Service]; ok {
		t.Error("the rejected service port is in the state")
	}
	if n := len(rec.Batches()); n != 1 {
		t.Errorf("%d batches applied, want 1 (the second attempt)", n)
	}
}
