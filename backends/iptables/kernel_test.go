package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// These tests program a real kernel in namespaces of testnet topologies
// and send real traffic through them. They cover what the conformance
// suite does not: flavours, the canary, refused rules, clean-up beside
// other programs' rules in the same built-in chains. They need root.

const probeTimeout = 2 * time.Second

// kernelEnv is a topology with helpers for its node namespace.
type kernelEnv struct {
	t  *testing.T
	tn *testnet.Topology
}

func newKernelEnv(t *testing.T, needs ...string) *kernelEnv {
	t.Helper()
	testnet.RequireRoot(t)
	for _, c := range append([]string{"iptables-nft-restore", "ip6tables-nft-restore", "nft"}, needs...) {
		testnet.RequireCommand(t, c)
	}
	return &kernelEnv{t: t, tn: testnet.New(t, testnet.Options{Node1Pods: 2, Node2Pods: 1})}
}

// backend returns a backend of family f in node1, closed at the end.
func (e *kernelEnv) backend(f model.IPFamily, cfg Config) *backend {
	e.t.Helper()
	cfg.NetNS = e.tn.Node1.Path()
	b, err := NewBackend(cfg, f)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { b.Close() })
	return b.(*backend)
}

// exec runs a program in node1.
func (e *kernelEnv) exec(args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.tn.Node1.Exec(ctx, args[0], args[1:]...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

var counters = regexp.MustCompile(`\[\d+:\d+\]|counter packets \d+ bytes \d+`)

// rules returns the rules (and chains) of a *-save output that contain
// none of skip, with counters and comments removed.
func rules(save string, skip ...string) string {
	var b strings.Builder
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		keep := true
		for _, s := range skip {
			if strings.Contains(l, s) {
				keep = false
			}
		}
		if keep {
			b.WriteString(counters.ReplaceAllString(l, "") + "\n")
		}
	}
	return b.String()
}

func (e *kernelEnv) pod(n, i int) *testnet.Pod {
	if n == 2 {
		return e.tn.Node2.Pods[i-1]
	}
	return e.tn.Node1.Pods[i-1]
}

// svc is a TCP service port on cluster IP ip:80 with endpoints on port
// 8080 of pods.
func (e *kernelEnv) svc(f model.IPFamily, name, ip string, pods ...*testnet.Pod) testSvc {
	var eps []string
	for _, p := range pods {
		eps = append(eps, netip.AddrPortFrom(p.IP(f), 8080).String())
	}
	return clusterSvc(name, model.TCP, ip, 80, eps...)
}

// answers probes addr from a host and returns the pod that answered, or
// fails the test.
func (e *kernelEnv) answers(from *testnet.Host, addr string) string {
	e.t.Helper()
	r := from.TCP(netip.MustParseAddrPort(addr), probeTimeout)
	if r.Outcome != testnet.Answered {
		e.t.Fatalf("%s -> %s: %v", from.Name, addr, r)
	}
	return r.Server
}

func mustSync(tb testing.TB, b *backend, req *proxier.SyncRequest) {
	tb.Helper()
	if err := b.Sync(tb.Context(), req); err != nil {
		tb.Fatalf("sync: %+v", err)
	}
}

func TestKernelFlavourDetection(t *testing.T) {
	e := newKernelEnv(t, "iptables-legacy-restore", "iptables-legacy")
	node := &e.tn.Node1.Host
	if m, err := detect(Config{Config: proxier.Config{NetNS: e.tn.Node1.Path()}}.WithDefaults()); err != nil || m != ModeNFT {
		t.Fatalf("empty namespace: %s %v, want nft", m, err)
	}
	// Another program's rule in the legacy tables: legacy is in use.
	e.exec("iptables-legacy", "-w", "-A", "INPUT", "-s", "192.0.2.99/32", "-j", "ACCEPT")
	b := e.backend(model.IPv4, Config{})
	if b.run.Tools().Flavour != iptables.Legacy {
		t.Fatalf("with a legacy rule: %s, want legacy", b.run.Tools().Flavour)
	}
	p11 := e.pod(1, 1)
	mustSync(t, b, request(model.IPv4, []testSvc{e.svc(model.IPv4, "web", "10.96.0.10", p11)}, nil))
	if got := e.answers(node, "10.96.0.10:80"); got != p11.Name {
		t.Fatalf("legacy flavour: answered by %s", got)
	}
	if !strings.Contains(e.exec("iptables-legacy-save"), ":PROXYKIT-SERVICES") || strings.Contains(e.exec("iptables-nft-save"), "PROXYKIT") {
		t.Fatal("rules not in the legacy tables only")
	}
	// Our chains are a stronger hint than rule counts: with more rules in
	// nft, the legacy chains of ours still win.
	for i := range 3 {
		e.exec("iptables-nft", "-w", "-A", "INPUT", "-s", fmt.Sprintf("192.0.2.%d/32", 100+i), "-j", "ACCEPT")
	}
	if m, err := detect(Config{Config: proxier.Config{NetNS: e.tn.Node1.Path()}}.WithDefaults()); err != nil || m != ModeLegacy {
		t.Fatalf("with our chains in legacy: %s %v", m, err)
	}
	if err := b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if out := e.exec("iptables-legacy-save"); strings.Contains(out, "PROXYKIT") || !strings.Contains(out, "-A INPUT -s 192.0.2.99/32 -j ACCEPT") {
		t.Fatalf("after Cleanup:\n%s", out)
	}
	// An explicit mode overrides detection.
	nb := e.backend(model.IPv4, Config{Mode: ModeNFT})
	if nb.run.Tools().Flavour != iptables.NFT {
		t.Fatalf("ModeNFT: %s", nb.run.Tools().Flavour)
	}
	// Our chains in nft (counted from its chain lists, not its rules)
	// beat another program's rule in legacy.
	mustSync(t, nb, request(model.IPv4, []testSvc{e.svc(model.IPv4, "web", "10.96.0.10", p11)}, nil))
	if m, err := detect(Config{Config: proxier.Config{NetNS: e.tn.Node1.Path()}}.WithDefaults()); err != nil || m != ModeNFT {
		t.Fatalf("with our chains in nft: %s %v", m, err)
	}
}

func TestKernelLegacy(t *testing.T) {
	e := newKernelEnv(t, "iptables-legacy-restore", "ip6tables-legacy-restore")
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			b := e.backend(f, Config{Mode: ModeLegacy})
			p11, p21 := e.pod(1, 1), e.pod(2, 1)
			ip, lb, empty := "10.96.1.10", "203.0.113.7", "10.96.1.11"
			wrap := func(a string, port int) string { return fmt.Sprintf("%s:%d", a, port) }
			if f == model.IPv6 {
				ip, lb, empty = "fd00:10:96::110", "2001:db8:ff::7", "fd00:10:96::111"
				wrap = func(a string, port int) string { return fmt.Sprintf("[%s]:%d", a, port) }
			}
			s := e.svc(f, "web", ip, p11, p21)
			s.Port.NodePort = 30080
			s.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(lb)}
			s.Port.SessionAffinity = true
			none := e.svc(f, "none", empty)
			mustSync(t, b, request(f, []testSvc{s, none}, nil))
			first := e.answers(&e.pod(1, 2).Host, wrap(ip, 80))
			for range 5 {
				if got := e.answers(&e.pod(1, 2).Host, wrap(ip, 80)); got != first {
					t.Fatalf("affinity: %s then %s", first, got)
				}
			}
			e.answers(e.tn.Client, wrap(e.tn.Node1.ExternalIP(f).String(), 30080))
			e.answers(e.tn.Client, wrap(lb, 80))
			if r := e.tn.Node1.TCP(netip.MustParseAddrPort(wrap(empty, 80)), probeTimeout); !r.Outcome.Rejected() {
				t.Fatalf("no endpoints: %v, want rejected", r)
			}
			// A partial sync: the endpoint set changes.
			s2 := e.svc(f, "web", ip, p21)
			s2.Port = s.Port
			mustSync(t, b, request(f, []testSvc{s2, none}, backendtest.Names(s2)))
			for range 5 {
				if got := e.answers(e.tn.Client, wrap(lb, 80)); got != p21.Name {
					t.Fatalf("after the change: %s", got)
				}
			}
			if err := b.Cleanup(t.Context()); err != nil {
				t.Fatal(err)
			}
			save := "iptables-legacy-save"
			if f == model.IPv6 {
				save = "ip6tables-legacy-save"
			}
			if out := e.exec(save); strings.Contains(out, "PROXYKIT") {
				t.Fatalf("after Cleanup:\n%s", out)
			}
		})
	}
}

func TestKernelCanaryFlushResync(t *testing.T) {
	e := newKernelEnv(t)
	b := e.backend(model.IPv4, Config{})
	node, p11, p21 := &e.tn.Node1.Host, e.pod(1, 1), e.pod(2, 1)
	a := e.svc(model.IPv4, "a", "10.96.2.1", p11)
	mustSync(t, b, request(model.IPv4, []testSvc{a}, nil))
	e.answers(node, "10.96.2.1:80")

	// A firewall reload: everything in nat and filter is flushed and
	// deleted, ours included.
	for _, tb := range []string{"nat", "filter"} {
		e.exec("iptables-nft", "-w", "-t", tb, "-F")
		e.exec("iptables-nft", "-w", "-t", tb, "-X")
	}
	if r := node.TCP(netip.MustParseAddrPort("10.96.2.1:80"), time.Second); r.Outcome == testnet.Answered {
		t.Fatal("the service still answers after the flush")
	}
	// The next partial sync finds the canary gone and rewrites all.
	bsvc := e.svc(model.IPv4, "b", "10.96.2.2", p21)
	mustSync(t, b, request(model.IPv4, []testSvc{a, bsvc}, backendtest.Names(bsvc)))
	if !b.last.full {
		t.Fatal("the sync after the flush was not a full one")
	}
	if got := e.answers(node, "10.96.2.1:80"); got != p11.Name {
		t.Fatalf("a after the resync: %s", got)
	}
	if got := e.answers(node, "10.96.2.2:80"); got != p21.Name {
		t.Fatalf("b after the resync: %s", got)
	}

	// Flushing only the filter table (rules gone, chains kept) is
	// noticed by the next sync that writes filter, or the next full
	// request (the periodic one, which otherwise only compares).
	e.exec("iptables-nft", "-w", "-t", "filter", "-F")
	mustSync(t, b, request(model.IPv4, []testSvc{a, bsvc}, nil))
	if !b.last.full {
		t.Fatal("a filter flush was not noticed")
	}
	if out := e.exec("iptables-nft", "-w", "-t", "filter", "-S", "FORWARD"); !strings.Contains(out, "-j PROXYKIT-SERVICES") {
		t.Fatalf("jumps not restored:\n%s", out)
	}
	// An intact canary: the full request only compares and writes
	// nothing but the canary checks; a deleted jump is put back. The
	// jumps are read with iptables -S of the built-in chains, not
	// checked with -C lines in the run (which fetch every rule of the
	// chain jumped to).
	e.exec("iptables-nft", "-w", "-t", "nat", "-D", "OUTPUT", "-m", "comment", "--comment", "proxykit service portals", "-j", "PROXYKIT-SERVICES")
	mustSync(t, b, request(model.IPv4, []testSvc{a, bsvc}, nil))
	if b.last.full || b.last.lines != 8 {
		t.Fatalf("a full request with the canary intact: %+v", b.last)
	}
	if got := e.answers(node, "10.96.2.1:80"); got != p11.Name {
		t.Fatalf("a after the jump was put back: %s", got)
	}
	// A rule of ours deleted behind our back: the partial sync that
	// would delete it notices and rewrites everything.
	e.exec("iptables-nft", "-w", "-t", "nat", "-F", b.r.n.chain(kindSVC, b.r.n.serviceHash(a.Port.Name)))
	e.exec("iptables-nft", "-w", "-t", "nat", "-D", "PROXYKIT-SERVICES", "-m", "comment", "--comment", "default/a/TCP cluster IP",
		"-d", "10.96.2.1/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-g", b.r.n.chain(kindSVC, b.r.n.serviceHash(a.Port.Name)))
	mustSync(t, b, request(model.IPv4, []testSvc{bsvc}, backendtest.Names(a)))
	if !b.last.full {
		t.Fatal("a missing rule was not noticed")
	}
	if r := node.TCP(netip.MustParseAddrPort("10.96.2.1:80"), time.Second); r.Outcome == testnet.Answered {
		t.Fatal("a deleted service answers")
	}
	mustSync(t, b, request(model.IPv4, []testSvc{a, bsvc}, backendtest.Names(a)))
	if got := e.answers(node, "10.96.2.1:80"); got != p11.Name {
		t.Fatalf("a re-added: %s", got)
	}
	// A partial sync without changes runs nothing.
	mustSync(t, b, request(model.IPv4, []testSvc{a, bsvc}, backendtest.Names(a)))
	if b.last.lines != 0 {
		t.Fatalf("a partial sync without changes wrote %d lines", b.last.lines)
	}
}

func TestKernelRefusedRuleKeepsPreviousRules(t *testing.T) {
	e := newKernelEnv(t)
	node, p11, p21 := &e.tn.Node1.Host, e.pod(1, 1), e.pod(2, 1)
	for _, tc := range []struct {
		name string
		bad  string // the rule the backend is made to write
	}{
		{"ParseError", "-m pkbogus -j RETURN"},
		// The kernel refuses REJECT in nat; iptables-nft names the line.
		{"KernelError", "-j REJECT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := e.backend(model.IPv4, Config{RewriteInterval: -1})
			defer b.Close() // the next case's backend owns the chains then
			a := e.svc(model.IPv4, "a", "10.96.3.1", p11)
			other := e.svc(model.IPv4, "other", "10.96.3.2", p11)
			mustSync(t, b, request(model.IPv4, []testSvc{a, other}, nil))

			badRule(b, func(n model.ServicePortName) string {
				if n == a.Port.Name {
					return tc.bad
				}
				return ""
			})
			// a moves to pod2 (with the bad rule), other too, and c
			// appears: a keeps its rules, the rest goes through.
			a2, other2 := e.svc(model.IPv4, "a", "10.96.3.1", p21), e.svc(model.IPv4, "other", "10.96.3.2", p21)
			c := e.svc(model.IPv4, "c", "10.96.3.3", p21)
			svcs := []testSvc{a2, other2, c}
			err := b.Sync(t.Context(), request(model.IPv4, svcs, backendtest.Names(a2, other2, c)))
			checkRefused(t, err, a.Port.Name, tc.bad)
			if got := e.answers(node, "10.96.3.1:80"); got != p11.Name {
				t.Fatalf("a after its refused change: %s, want its previous endpoint %s", got, p11.Name)
			}
			for _, addr := range []string{"10.96.3.2:80", "10.96.3.3:80"} {
				if got := e.answers(node, addr); got != p21.Name {
					t.Fatalf("%s: %s", addr, got)
				}
			}
			// A full rewrite keeps a's previous rules as well.
			err = b.Sync(t.Context(), request(model.IPv4, svcs, nil))
			checkRefused(t, err, a.Port.Name, tc.bad)
			if got := e.answers(node, "10.96.3.1:80"); got != p11.Name {
				t.Fatalf("a after a full sync: %s", got)
			}
			// Once the rule is fine, a follows.
			badRule(b, nil)
			mustSync(t, b, request(model.IPv4, svcs, backendtest.Names(a2)))
			if got := e.answers(node, "10.96.3.1:80"); got != p21.Name {
				t.Fatalf("a after the fix: %s", got)
			}
			if err := b.Cleanup(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkRefused requires err to be one ObjectError naming svc and the
// refused rule.
func checkRefused(t *testing.T, err error, svc model.ServicePortName, rule string) {
	t.Helper()
	var oe *proxier.ObjectError
	if !errors.As(err, &oe) || oe.Service != svc || !strings.Contains(err.Error(), rule) || !proxier.OnlyObjectErrors(err) {
		t.Fatalf("sync error %v; want an ObjectError for %s naming %q", err, svc, rule)
	}
	t.Logf("refused: %v", err)
}

func TestKernelCoexistenceAndCleanup(t *testing.T) {
	e := newKernelEnv(t)
	node, p11 := &e.tn.Node1.Host, e.pod(1, 1)
	// Another program's rules, in the built-in chains the backend jumps
	// from and in a chain of its own.
	other := [][]string{
		{"-t", "nat", "-A", "PREROUTING", "-s", "192.0.2.99/32", "-j", "RETURN"},
		{"-t", "nat", "-N", "OTHER"},
		{"-t", "nat", "-A", "OTHER", "-d", "192.0.2.98/32", "-j", "RETURN"},
		{"-t", "nat", "-A", "OUTPUT", "-j", "OTHER"},
		{"-t", "filter", "-A", "INPUT", "-s", "192.0.2.99/32", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"},
	}
	for _, c := range other {
		e.exec(append([]string{"iptables-nft", "-w"}, c...)...)
	}
	e.exec("ip6tables-nft", "-w", "-A", "INPUT", "-s", "2001:db8:99::1/128", "-j", "ACCEPT")
	before4, before6 := rules(e.exec("iptables-nft-save")), rules(e.exec("ip6tables-nft-save"))
	beforeNft := counters.ReplaceAllString(e.exec("nft", "list", "ruleset"), "")

	b4, b6 := e.backend(model.IPv4, Config{}), e.backend(model.IPv6, Config{})
	s4 := e.svc(model.IPv4, "web", "10.96.4.1", p11)
	s4.Port.NodePort = 30080
	s6 := e.svc(model.IPv6, "web", "fd00:10:96::41", p11)
	mustSync(t, b4, request(model.IPv4, []testSvc{s4}, nil))
	mustSync(t, b6, request(model.IPv6, []testSvc{s6}, nil))
	e.answers(node, "10.96.4.1:80")
	e.answers(node, "[fd00:10:96::41]:80")
	// Our jumps are at the top of the built-in chains, the other
	// program's rules below, unchanged.
	nat := e.exec("iptables-nft", "-w", "-t", "nat", "-S", "PREROUTING")
	if i, j := strings.Index(nat, "PROXYKIT-SERVICES"), strings.Index(nat, "192.0.2.99"); i < 0 || j < i {
		t.Fatalf("nat PREROUTING:\n%s", nat)
	}
	if got := rules(e.exec("iptables-nft-save"), "PROXYKIT"); got != before4 {
		t.Fatalf("the other program's IPv4 rules changed:\n--- before\n%s--- after\n%s", before4, got)
	}
	// A second full rewrite and a restart keep the jumps single.
	b4.lastRewrite = time.Time{}
	mustSync(t, b4, request(model.IPv4, []testSvc{s4}, nil))
	b4.Close() // a restart: the chains have one owner at a time
	b4b := e.backend(model.IPv4, Config{})
	mustSync(t, b4b, request(model.IPv4, []testSvc{s4}, nil))
	if n := strings.Count(e.exec("iptables-nft", "-w", "-t", "nat", "-S", "PREROUTING"), "PROXYKIT"); n != 1 {
		t.Fatalf("%d jumps in nat PREROUTING", n)
	}

	// Cleanup by the IPv4 backend leaves IPv6 alone, and vice versa.
	if err := b4b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(e.exec("iptables-nft-save"), "PROXYKIT") || !strings.Contains(e.exec("ip6tables-nft-save"), "PROXYKIT") {
		t.Fatal("IPv4 cleanup")
	}
	if err := b6.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := rules(e.exec("iptables-nft-save")); got != before4 {
		t.Fatalf("IPv4 after Cleanup:\n--- before\n%s--- after\n%s", before4, got)
	}
	if got := rules(e.exec("ip6tables-nft-save")); got != before6 {
		t.Fatalf("IPv6 after Cleanup:\n--- before\n%s--- after\n%s", before6, got)
	}
	// The built-in chains and tables the backend created are gone too.
	if got := counters.ReplaceAllString(e.exec("nft", "list", "ruleset"), ""); got != beforeNft {
		t.Fatalf("nft ruleset after Cleanup:\n--- before\n%s--- after\n%s", beforeNft, got)
	}
	// Cleanup again, and on a namespace without anything, succeeds.
	if err := b4b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestKernelCleanupBothFlavours(t *testing.T) {
	e := newKernelEnv(t, "iptables-legacy-restore")
	legacy := e.backend(model.IPv4, Config{Mode: ModeLegacy})
	nft := e.backend(model.IPv4, Config{Mode: ModeNFT})
	s := e.svc(model.IPv4, "web", "10.96.5.1", e.pod(1, 1))
	mustSync(t, legacy, request(model.IPv4, []testSvc{s}, nil))
	mustSync(t, nft, request(model.IPv4, []testSvc{s}, nil))
	// A new instance that never synced cleans both, once they are gone.
	legacy.Close()
	nft.Close()
	fresh := e.backend(model.IPv4, Config{})
	if err := fresh.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		if out := e.exec(save); strings.Contains(out, "PROXYKIT") {
			t.Fatalf("%s after Cleanup:\n%s", save, out)
		}
	}
	if out := e.exec("nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Fatalf("nft ruleset after Cleanup:\n%s", out)
	}
}

func TestNewWithoutPrograms(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := New(Config{})
	if !errors.Is(err, proxier.ErrNotSupported) || !strings.Contains(err.Error(), "iptables") {
		t.Fatalf("New without programs: %v", err)
	}
	_, err = NewBackend(Config{Mode: ModeNFT}, model.IPv6)
	var ue *proxier.UnsupportedError
	if !errors.As(err, &ue) || ue.What != "program ip6tables-nft-restore" {
		t.Fatalf("NewBackend without programs: %v", err)
	}
}

func TestNewInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{MasqueradeBit: 0x3},
		{ChainPrefix: "FAR-TOO-LONG-PREFIX"},
		{Mode: "iptables"},
		{Config: proxier.Config{NetNS: "/nonexistent/netns"}},
	} {
		if _, err := NewBackend(cfg, model.IPv4); err == nil {
			t.Errorf("NewBackend(%+v) succeeded", cfg)
		}
	}
	if _, err := NewBackend(Config{}, 5); err == nil {
		t.Error("family 5 accepted")
	}
}

// A complete rewrite of the nft flavour runs iptables-nft-restore several
// times; a rule refused in a later run maps back to its service port,
// which is left out while everything else is programmed.
func TestKernelRefusedRuleInLaterRun(t *testing.T) {
	e := newKernelEnv(t)
	node, p11, p21 := &e.tn.Node1.Host, e.pod(1, 1), e.pod(2, 1)
	b := e.backend(model.IPv4, Config{Mode: ModeNFT, RewriteInterval: -1})
	// Sections of one service port (two chains each), two per run.
	b.chunkSize, b.runSections = 2, 2
	var svcs []testSvc
	for i := range 7 {
		pod := p11
		if i%2 == 1 {
			pod = p21
		}
		svcs = append(svcs, e.svc(model.IPv4, fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.4.%d", i+1), pod))
	}
	bad := svcs[5].Port.Name
	badRule(b, func(n model.ServicePortName) string {
		if n == bad {
			return "-j REJECT"
		}
		return ""
	})
	err := b.Sync(t.Context(), request(model.IPv4, svcs, nil))
	checkRefused(t, err, bad, "-j REJECT")
	// One section per service port programmed, and the last one.
	if b.last.sections != len(svcs) {
		t.Fatalf("%d sections, want %d", b.last.sections, len(svcs))
	}
	for i, s := range svcs {
		addr := netip.AddrPortFrom(s.Port.ClusterIP, 80)
		if s.Port.Name == bad {
			if r := node.TCP(addr, probeTimeout); r.Outcome == testnet.Answered {
				t.Errorf("the refused service port answers: %v", r)
			}
			continue
		}
		want := p11.Name
		if i%2 == 1 {
			want = p21.Name
		}
		if got := e.answers(node, addr.String()); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
	// Fixed, the next complete rewrite programs it too.
	badRule(b, nil)
	mustSync(t, b, request(model.IPv4, svcs, nil))
	if got := e.answers(node, "10.96.4.6:80"); got != p21.Name {
		t.Fatalf("the fixed service port: %s", got)
	}
}

// TestKernelRefusedRuleAtFirstSync: the first sync into tables
// holding nothing of ours inserts the jumps from the built-in chains. When
// a rule of either table is refused after the other table's commit (the
// filter table commits before nat), the retry checks that table's jumps
// instead of inserting them a second time: each built-in chain ends with
// as many jumps to our chains as a clean sync writes.
func TestKernelRefusedRuleAtFirstSync(t *testing.T) {
	for _, mode := range []Mode{ModeNFT, ModeLegacy} {
		for _, refused := range []string{"filter", "nat"} {
			t.Run(string(mode)+"/"+refused, func(t *testing.T) {
				e := newKernelEnv(t, "iptables-"+string(mode)+"-restore")
				node, p11 := &e.tn.Node1.Host, e.pod(1, 1)
				b := e.backend(model.IPv4, Config{Mode: mode})
				web := e.svc(model.IPv4, "web", "10.96.5.1", p11)
				bad := e.svc(model.IPv4, "bad", "10.96.5.2")
				want := "pkbogus"
				if refused == "filter" {
					badVerdict(b, func(n model.ServicePortName) string {
						if n == bad.Port.Name {
							return "REJECT --reject-with pkbogus"
						}
						return ""
					})
				} else {
					bad = e.svc(model.IPv4, "bad", "10.96.5.2", p11)
					want = "--to-destination"
					badRule(b, func(n model.ServicePortName) string {
						if n == bad.Port.Name {
							return "-j DNAT --to-destination 10.0.0.1:pkbogus"
						}
						return ""
					})
				}
				err := b.Sync(t.Context(), request(model.IPv4, []testSvc{web, bad}, nil))
				checkRefused(t, err, bad.Port.Name, want)
				if got := e.answers(node, "10.96.5.1:80"); got != p11.Name {
					t.Fatalf("web: %s, want %s", got, p11.Name)
				}
				for _, c := range []struct {
					table, chain string
					jumps        int
				}{
					{"nat", "PREROUTING", 1}, {"nat", "OUTPUT", 1}, {"nat", "POSTROUTING", 1},
					{"filter", "INPUT", 2}, {"filter", "FORWARD", 3}, {"filter", "OUTPUT", 2},
				} {
					out := e.exec("iptables-"+string(mode), "-w", "-t", c.table, "-S", c.chain)
					if n := strings.Count(out, "-j PROXYKIT-"); n != c.jumps {
						t.Errorf("%d jumps to our chains in %s %s, want %d:\n%s", n, c.table, c.chain, c.jumps, out)
					}
				}
			})
		}
	}
}

// TestKernelSecondProxierRefused checks that a second proxier of the same
// chains in one namespace is refused at New, naming the holder, while one
// with another chain prefix is not, and that the chains are free again
// once the first is closed.
func TestKernelSecondProxierRefused(t *testing.T) {
	e := newKernelEnv(t)
	cfg := Config{Config: proxier.Config{NetNS: e.tn.Node1.Path(), Families: []model.IPFamily{model.IPv4}}}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg)
	if !errors.Is(err, ownerlock.ErrHeld) || !strings.Contains(err.Error(), "this process") {
		t.Fatalf("second proxier of the same chains: %v; want it refused as held by this process", err)
	}
	other := cfg
	other.ChainPrefix = "OTHER"
	p, err := New(other)
	if err != nil {
		t.Fatalf("proxier with another chain prefix: %v", err)
	}
	p.Close()
	first.Close()
	again, err := New(cfg)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	again.Close()
}

// TestKernelAdoptsMatchingChains: a new process whose first sync would
// write what our chains hold (the fingerprint rule of the last rewrite
// says so) adopts them: nothing is restored, every rule keeps its nft
// handle. A partial sync flushes the fingerprint, so the next process
// rewrites; so does one that wants something else, or finds a chain of
// ours it would not write.
func TestKernelAdoptsMatchingChains(t *testing.T) {
	e := newKernelEnv(t)
	node, p11, p21 := &e.tn.Node1.Host, e.pod(1, 1), e.pod(2, 1)
	a := e.svc(model.IPv4, "a", "10.96.3.1", p11)
	bsvc := e.svc(model.IPv4, "b", "10.96.3.2", p21)
	cfg := Config{Mode: ModeNFT}
	// handles lists the nat and filter tables with the handle of every
	// rule, which a rewrite changes.
	handles := func() string {
		t.Helper()
		var out string
		for _, tb := range []string{"nat", "filter"} {
			out += counters.ReplaceAllString(e.exec("nft", "-a", "list", "table", "ip", tb), "")
		}
		return out
	}
	fingerprinted := func() bool {
		return strings.Contains(e.exec("iptables-nft-save", "-t", "nat"), "-A PROXYKIT-FINGERPRINT -m comment --comment")
	}
	first := func(svcs ...testSvc) *backend {
		t.Helper()
		b := e.backend(model.IPv4, cfg)
		mustSync(t, b, request(model.IPv4, svcs, nil))
		return b
	}

	b1 := first(a, bsvc)
	if !fingerprinted() {
		t.Fatalf("no fingerprint rule after a rewrite:\n%s", e.exec("iptables-nft-save", "-t", "nat"))
	}
	before := handles()
	b1.Close()
	b2 := first(a, bsvc)
	if !b2.last.adopted {
		t.Errorf("the second process rewrote chains that hold what it wants: %+v", b2.last)
	}
	if after := handles(); after != before {
		t.Errorf("the adopted chains were rewritten:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := e.answers(node, "10.96.3.2:80"); got != p21.Name {
		t.Fatalf("b after adopting: %s", got)
	}
	// A partial sync from the adopted state works, and flushes the
	// fingerprint.
	a2 := e.svc(model.IPv4, "a", "10.96.3.1", p21)
	mustSync(t, b2, request(model.IPv4, []testSvc{a2, bsvc}, backendtest.Names(a2)))
	if b2.last.full || fingerprinted() {
		t.Fatalf("after a partial sync: %+v, fingerprint rule still there: %v", b2.last, fingerprinted())
	}
	if got := e.answers(node, "10.96.3.1:80"); got != p21.Name {
		t.Fatalf("a after the partial sync: %s", got)
	}
	b2.Close()
	if b3 := first(a2, bsvc); b3.last.adopted || !fingerprinted() {
		t.Errorf("after a partial sync the next process adopted (%+v) or wrote no fingerprint", b3.last)
	} else {
		b3.Close()
	}
	// Another state, or a chain of ours it would not write: rewritten.
	b4 := first(a2)
	if b4.last.adopted {
		t.Errorf("chains that hold another state were adopted")
	}
	if r := node.TCP(netip.MustParseAddrPort("10.96.3.2:80"), time.Second); r.Outcome == testnet.Answered {
		t.Fatal("a service that is gone answers")
	}
	b4.Close()
}

// TestKernelChecksAdoptedChains: the nft flavour adopts on the
// fingerprint and the jumps, and lists our chains after the sync
// (verify.go). A chain of ours left beside them (hand-made here) or one
// deleted behind our back (with the rule that jumped to it, which broke
// the service) is found by that check, and the next sync lists the
// chains again and rewrites everything: the left-over chain is deleted,
// the missing one written, the service answers again. A check that
// fails, or whose dumps are always interrupted, never leads to trusting
// the chains: the next sync lists them itself (and adopts them, as they
// match).
func TestKernelChecksAdoptedChains(t *testing.T) {
	e := newKernelEnv(t)
	node, p11, p21 := &e.tn.Node1.Host, e.pod(1, 1), e.pod(2, 1)
	a := e.svc(model.IPv4, "a", "10.96.3.1", p11)
	bsvc := e.svc(model.IPv4, "b", "10.96.3.2", p21)
	svcs := []testSvc{a, bsvc}
	cfg := Config{Mode: ModeNFT}
	save := func() string { return e.exec("iptables-nft-save", "-t", "nat") }
	// first starts a process whose first sync must adopt, and waits for
	// its check.
	first := func(list chainLister) *backend {
		t.Helper()
		b := e.backend(model.IPv4, cfg)
		b.listChains = list
		mustSync(t, b, request(model.IPv4, svcs, nil))
		if !b.last.adopted || b.check == nil {
			t.Fatalf("the first sync did not adopt with a check to follow: %+v", b.last)
		}
		<-b.check.done
		return b
	}
	// again syncs without a change, as the engine's next sync does.
	again := func(b *backend) {
		t.Helper()
		mustSync(t, b, request(model.IPv4, svcs, []model.ServicePortName{}))
	}
	b1 := e.backend(model.IPv4, cfg)
	mustSync(t, b1, request(model.IPv4, svcs, nil))
	b1.Close()

	// Nothing wrong: the check agrees, the next sync writes nothing.
	b := first(nil)
	if c := b.check; c.err != nil || c.interrupted || len(slices.Concat(c.stray[:]...)) > 0 || len(slices.Concat(c.missing[:]...)) > 0 {
		t.Fatalf("check of matching chains: err %v, interrupted %v, left over %v, missing %v", c.err, c.interrupted, c.stray, c.missing)
	}
	again(b)
	if b.st == nil || b.last.full || b.listFirst {
		t.Fatalf("after a check that agreed: %+v, listFirst %v", b.last, b.listFirst)
	}
	b.Close()

	// A left-over chain of ours.
	e.exec("iptables-nft", "-w", "-t", "nat", "-N", "PROXYKIT-SVC-HANDMADE")
	b = first(nil)
	if got := b.check.stray[tNAT]; !slices.Equal(got, []string{"PROXYKIT-SVC-HANDMADE"}) {
		t.Errorf("left over: %v", got)
	}
	again(b)
	if !b.last.full || b.last.adopted {
		t.Errorf("the sync after the check did not rewrite: %+v", b.last)
	}
	if strings.Contains(save(), "PROXYKIT-SVC-HANDMADE") {
		t.Error("the hand-made chain survived the rewrite")
	}
	if got := e.answers(node, "10.96.3.1:80"); got != p11.Name {
		t.Fatalf("a after the rewrite: %s", got)
	}
	b.Close()

	// A missing chain: a's endpoint chain, deleted with the rules of
	// a's service chain.
	var others []string
	sepChain := ""
	b = first(nil)
	for _, c := range b.st.svcs[tNAT][a.Port.Name].chains {
		if strings.Contains(c.name, "-"+kindSEP+"-") {
			sepChain = c.name
		} else {
			others = append(others, c.name)
		}
	}
	b.Close()
	if sepChain == "" || len(others) == 0 {
		t.Fatalf("no endpoint chain, or no other chain, for a: %q %q", sepChain, others)
	}
	for _, c := range append(others, sepChain) {
		e.exec("iptables-nft", "-w", "-t", "nat", "-F", c)
	}
	e.exec("iptables-nft", "-w", "-t", "nat", "-X", sepChain)
	if r := node.TCP(netip.MustParseAddrPort("10.96.3.1:80"), time.Second); r.Outcome == testnet.Answered {
		t.Fatal("a answers without its endpoint chain")
	}
	b = first(nil)
	if got := b.check.missing[tNAT]; !slices.Equal(got, []string{sepChain}) {
		t.Errorf("missing: %v, want %s", got, sepChain)
	}
	again(b)
	if !b.last.full || b.last.adopted {
		t.Errorf("the sync after the check did not rewrite: %+v", b.last)
	}
	if got := e.answers(node, "10.96.3.1:80"); got != p11.Name {
		t.Fatalf("a after the rewrite: %s", got)
	}
	b.Close()

	// What the listing found but the kernel no longer holds, or holds
	// again, as when a sync creates and deletes a chain while the dump
	// runs, is looked up by name and not held against the chains.
	listed := map[string][]string{}
	dropped := ""
	for _, tb := range []string{"nat", "filter"} {
		for l := range strings.Lines(e.exec("iptables-nft-save", "-t", tb)) {
			if name, ok := strings.CutPrefix(l, ":"); ok {
				name, _, _ = strings.Cut(name, " ")
				if dropped == "" && strings.Contains(name, "-"+kindSEP+"-") {
					dropped = name
					continue
				}
				listed[tb] = append(listed[tb], name)
			}
		}
	}
	listed["nat"] = append(listed["nat"], "PROXYKIT-SEP-GONE")
	b = first(func(context.Context) (map[string][]string, bool, bool, error) { return listed, false, true, nil })
	if !slices.Equal(b.check.stray[tNAT], []string{"PROXYKIT-SEP-GONE"}) || !slices.Equal(b.check.missing[tNAT], []string{dropped}) {
		t.Fatalf("listing: left over %v, missing %v; want PROXYKIT-SEP-GONE, %s", b.check.stray, b.check.missing, dropped)
	}
	again(b)
	if b.st == nil || b.last.full || b.listFirst {
		t.Errorf("chains the kernel holds as adopted were listed again or rewritten: %+v, listFirst %v", b.last, b.listFirst)
	}
	b.Close()

	// A check that fails or is always interrupted: the next sync lists
	// the chains itself, and adopts them.
	for name, list := range map[string]chainLister{
		"failed": func(context.Context) (map[string][]string, bool, bool, error) {
			return nil, false, true, errors.New("no netlink today")
		},
		"interrupted": func(context.Context) (map[string][]string, bool, bool, error) {
			return map[string][]string{}, true, true, nil
		},
	} {
		b = first(list)
		if b.check.err == nil && (!b.check.interrupted || b.check.attempts != checkAttempts) {
			t.Errorf("%s: check %+v", name, b.check)
		}
		again(b)
		if !b.last.adopted || b.check != nil || b.listFirst {
			t.Errorf("%s: the next sync did not list the chains and adopt them: %+v, check %v, listFirst %v", name, b.last, b.check, b.listFirst)
		}
		if got := e.answers(node, "10.96.3.2:80"); got != p21.Name {
			t.Fatalf("%s: b: %s", name, got)
		}
		b.Close()
	}

	// A jump from a built-in chain missing (found by iptables -S of
	// the chain, not -C): not adopted, and the jump is back.
	b = e.backend(model.IPv4, cfg)
	j := b.r.jumps()[len(b.r.jumps())-1]
	b.Close()
	e.exec(append([]string{"iptables-nft", "-w", "-t", j.table.String(), "-D", j.chain}, j.rule...)...)
	b = e.backend(model.IPv4, cfg)
	mustSync(t, b, request(model.IPv4, svcs, nil))
	if b.last.adopted || b.check != nil {
		t.Errorf("adopted without the jump %s %v: %+v", j.chain, j.rule, b.last)
	}
	e.exec(append([]string{"iptables-nft", "-w", "-t", j.table.String(), "-C", j.chain}, j.rule...)...)
	b.Close()
}

// TestKernelAdoptsLegacy: the legacy flavour, whose chains the first sync
// reads with iptables-legacy-save, adopts as the nft one does.
func TestKernelAdoptsLegacy(t *testing.T) {
	e := newKernelEnv(t, "iptables-legacy-restore", "iptables-legacy")
	node, p11 := &e.tn.Node1.Host, e.pod(1, 1)
	a := e.svc(model.IPv4, "a", "10.96.3.5", p11)
	cfg := Config{Mode: ModeLegacy}
	b1 := e.backend(model.IPv4, cfg)
	mustSync(t, b1, request(model.IPv4, []testSvc{a}, nil))
	b1.Close()
	b2 := e.backend(model.IPv4, cfg)
	mustSync(t, b2, request(model.IPv4, []testSvc{a}, nil))
	if !b2.last.adopted {
		t.Errorf("legacy: chains that hold what the second process wants were rewritten: %+v", b2.last)
	}
	if got := e.answers(node, "10.96.3.5:80"); got != p11.Name {
		t.Fatalf("after adopting: %s", got)
	}
	// The jumps are read from the same iptables-legacy-save output: one
	// missing stops the adoption, and the rewrite puts it back.
	j := b2.r.jumps()[0]
	b2.Close()
	e.exec(append([]string{"iptables-legacy", "-w", "-t", j.table.String(), "-D", j.chain}, j.rule...)...)
	bj := e.backend(model.IPv4, cfg)
	mustSync(t, bj, request(model.IPv4, []testSvc{a}, nil))
	if bj.last.adopted {
		t.Errorf("legacy: adopted without the jump %s %v", j.chain, j.rule)
	}
	e.exec(append([]string{"iptables-legacy", "-w", "-t", j.table.String(), "-C", j.chain}, j.rule...)...)
	bj.Close()
	e.exec("iptables-legacy", "-w", "-t", "nat", "-N", "PROXYKIT-SVC-HANDMADE")
	b3 := e.backend(model.IPv4, cfg)
	mustSync(t, b3, request(model.IPv4, []testSvc{a}, nil))
	if b3.last.adopted || strings.Contains(e.exec("iptables-legacy-save", "-t", "nat"), "PROXYKIT-SVC-HANDMADE") {
		t.Errorf("legacy: chains beside a hand-made one of ours were adopted (%+v), or it survived", b3.last)
	}
	if err := b3.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
}
