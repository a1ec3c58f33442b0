package backends_test

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/proxier"
)

func TestNames(t *testing.T) {
	if got, want := backends.Names(), []string{"ebpf", "iptables", "ipvs", "nftables"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	if _, err := backends.New("nope", backends.Config{}); err == nil || !strings.Contains(err.Error(), "ebpf, iptables, ipvs, nftables") {
		t.Errorf("unknown backend: %v", err)
	}
}

// TestNewEBPFNeedsCgroup: the registry names the option eBPF cannot do
// without.
func TestNewEBPFNeedsCgroup(t *testing.T) {
	_, err := backends.New("ebpf", backends.Config{})
	if err == nil || !strings.Contains(err.Error(), "Config.EBPF.CgroupPath") {
		t.Errorf("New(ebpf) without a cgroup: %v; want an error naming Config.EBPF.CgroupPath", err)
	}
}

// TestNewUnknownScheduler: a scheduler the chosen backend does not
// implement fails New with the project's one "unsupported" error, before
// anything is opened.
func TestNewUnknownScheduler(t *testing.T) {
	for name, cfg := range map[string]backends.Config{
		"ipvs": {IPVS: ipvs.Config{Scheduler: "fifo"}},
		"ebpf": {EBPF: ebpf.Config{CgroupPath: "/nonexistent", Scheduler: proxier.SchedulerWeightedRoundRobin}},
	} {
		_, err := backends.New(name, cfg)
		var ue *proxier.UnsupportedError
		if !errors.Is(err, proxier.ErrNotSupported) || !errors.As(err, &ue) || !strings.Contains(ue.What, "scheduler") {
			t.Errorf("%s: %v; want an *UnsupportedError naming the scheduler", name, err)
		}
	}
}

// bpffs mounts a bpffs of the test's own and returns its directory.
func bpffs(t *testing.T) string {
	t.Helper()
	return testnet.BPFFS(t)
}

// pins lists the files of a pin directory, without the kernel's own.
func pins(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestNewEBPF builds the eBPF backend through the registry with options
// of its own (cgroup, pod namespaces, pin path, Maglev), checks that it
// serves a pod of node1 and pins its links and maps, and that CleanupAll,
// given the pin path but no cgroup and no proxier, removes the pinned
// programs and maps and the north-south table the stopped proxier left.
func TestNewEBPF(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	tp := testnet.New(t, testnet.Options{Node1Pods: 2, Node2Pods: 1})
	cfg := config(t, tp, "ebpf")
	cfg.EBPF.PinPath = bpffs(t)
	cfg.EBPF.Scheduler = "maglev"
	svc, slice := objects(tp.Node1.Pods[0], tp.Node2.Pods[0])
	_, stop := startWith(t, "ebpf", cfg, svc, slice)
	from := tp.Node1.Pods[1]
	if r := from.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second); r.Outcome != testnet.Answered {
		t.Fatalf("service not working: %v", r)
	}
	stop()
	if len(pins(t, cfg.EBPF.PinPath)) == 0 || residue(t, tp.Node1.NS, "ebpf") == "" {
		t.Fatalf("the stopped proxier left pins %v and table %q; the test proves nothing", pins(t, cfg.EBPF.PinPath), residue(t, tp.Node1.NS, "ebpf"))
	}
	// The pinned links keep the programs attached after the proxier.
	if r := from.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second); r.Outcome != testnet.Answered {
		t.Fatalf("pinned programs not serving after the proxier stopped: %v", r)
	}
	clean := cfg
	clean.EBPF.CgroupPath = ""
	if err := backends.CleanupAll(t.Context(), clean, ""); err != nil {
		t.Fatal(err)
	}
	if p := pins(t, cfg.EBPF.PinPath); len(p) != 0 {
		t.Errorf("pins after CleanupAll: %v", p)
	}
	if r := residue(t, tp.Node1.NS, "ebpf"); r != "" {
		t.Errorf("residue after CleanupAll: %s", r)
	}
	if r := from.TCP(netip.AddrPortFrom(vip, 80), 500*time.Millisecond); r.Outcome == testnet.Answered {
		t.Errorf("the service still answers after CleanupAll: %v", r)
	}
}

// TestCleanupAllUsesOptions: CleanupAll removes what backends left under
// the names their sections of the configuration give (a table, a chain
// prefix), not only the defaults.
func TestCleanupAllUsesOptions(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	svc, slice := objects(tp.Pods[0])
	cfg := config(t, tp, "")
	cfg.NFTables.TableName = "pk-custom"
	cfg.IPTables.ChainPrefix = "PKCUSTOM"
	for _, name := range []string{"nftables", "iptables"} {
		_, stop := startWith(t, name, cfg, svc, slice)
		stop()
	}
	left := func() []string {
		var out []string
		tables, err := tp.Node1.Exec(t.Context(), "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(tables, " pk-custom") {
			out = append(out, "table pk-custom")
		}
		for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
			rules, err := tp.Node1.Exec(t.Context(), save)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(rules, "PKCUSTOM-") {
				out = append(out, save+": PKCUSTOM chains")
			}
		}
		return out
	}
	if l := left(); len(l) != 2 {
		t.Fatalf("the stopped proxiers left %v; want a table and chains", l)
	}
	if err := backends.CleanupAll(t.Context(), cfg, ""); err != nil {
		t.Fatal(err)
	}
	if l := left(); len(l) != 0 {
		t.Errorf("left after CleanupAll: %v", l)
	}
}
