package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// left returns the namespaces of sandbox id still under NetNSDir.
func left(t *testing.T, id string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(NetNSDir, "pk-"+id+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSandbox builds a sandbox, probes the pods' servers from the node
// and the client, and tears it down, checking that no namespace is left.
func TestSandbox(t *testing.T) {
	RequirePrivilege(t)
	sb, err := New(context.Background(), Options{Node1Pods: 1, Node2Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			sb.Close()
		}
	}()
	if len(sb.Pods) != 2 || len(sb.Node1.Pods) != 1 || len(sb.Node2.Pods) != 1 || sb.Pods[0] != sb.Node1.Pods[0] {
		t.Fatalf("pods %d (node1 %d, node2 %d), want 1 per node, node1's first", len(sb.Pods), len(sb.Node1.Pods), len(sb.Node2.Pods))
	}
	local, remote := sb.Node1.Pods[0], sb.Node2.Pods[0]
	if local.Name != "node1-pod1" || local.IPv4 != netip.MustParseAddr("10.244.1.2") || local.Node != sb.Node1 {
		t.Errorf("node1's pod: %s %s behind %v", local.Name, local.IPv4, local.Node.Name)
	}
	if want := NetNSDir + "/pk-" + sb.ID + "-node1"; sb.Node1.NetNSPath() != want || sb.Node1.NetNSName() != filepath.Base(want) {
		t.Errorf("node1's namespace %s (%s), want %s", sb.Node1.NetNSPath(), sb.Node1.NetNSName(), want)
	}
	if n := len(left(t, sb.ID)); n != 6 { // 2 nodes, 2 pods, the client, the uplink
		t.Errorf("%d namespaces, want 6", n)
	}
	port := ServerPorts()[0]

	// TCP from node1 to its own pod.
	if r := sb.Node1.TCP(netip.AddrPortFrom(local.IPv4, port), 2*time.Second); r.Outcome != Answered || r.Server != local.Name || r.Proto != "tcp" || r.Port != port {
		t.Errorf("node1 → %s: %v", local.Name, r)
	}
	// UDP over IPv6 from the client, routed through both nodes, seeing
	// the client's own address.
	r := sb.Client.UDP(netip.AddrPortFrom(remote.IP(model.IPv6), port), 2*time.Second)
	if r.Outcome != Answered || r.Server != remote.Name || r.Proto != "udp" || r.Source.Addr() != sb.Client.IPv6 {
		t.Errorf("client → %s over UDP/IPv6: %v", remote.Name, r)
	}
	// SCTP from the pod to the remote pod.
	if r := local.SCTPInit(netip.AddrPortFrom(remote.IPv4, port), 2*time.Second); r.Outcome != Answered || r.Server != remote.Name || r.Source.Addr() != local.IPv4 {
		t.Errorf("%s → %s over SCTP: %v", local.Name, remote.Name, r)
	}
	// A closed port is refused; an address nobody routes is dropped.
	if r := sb.Client.TCP(netip.AddrPortFrom(local.IPv4, 1), 2*time.Second); r.Outcome != Refused || !r.Outcome.Rejected() {
		t.Errorf("client → closed port: %v, want refused", r)
	}
	if r := sb.Node1.TCP(netip.MustParseAddrPort("10.96.0.1:80"), 300*time.Millisecond); r.Outcome != TimedOut || !r.Outcome.Silent() {
		t.Errorf("node1 → unrouted service address: %v, want timed out", r)
	}

	// Do runs in the namespace: node1 forwards, the client does not.
	for _, h := range []struct {
		h    *Host
		want string
	}{{&sb.Node1.Host, "1"}, {sb.Client, "0"}} {
		var got []byte
		err := h.h.Do(func() error {
			var err error
			got, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			return err
		})
		if err != nil || strings.TrimSpace(string(got)) != h.want {
			t.Errorf("ip_forward in %s: %q, %v; want %s", h.h.Name, got, err, h.want)
		}
	}
	if _, err := sb.Node1.Exec(context.Background(), "no-such-program-proxykit"); err == nil || !strings.Contains(err.Error(), sb.Node1.NetNSName()) {
		t.Errorf("Exec of a missing program: %v", err)
	}

	closed = true
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if l := left(t, sb.ID); len(l) > 0 {
		t.Errorf("namespaces left after Close: %v", l)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestKeepAndRemove checks that Keep leaves the namespaces and Remove,
// given the ID as the demo prints it, removes them.
func TestKeepAndRemove(t *testing.T) {
	RequirePrivilege(t)
	sb, err := New(context.Background(), Options{Node1Pods: 1, Node2Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Keep(); err != nil {
		sb.Close()
		t.Fatal(err)
	}
	defer Remove(sb.ID)
	if l := left(t, sb.ID); len(l) != 6 {
		t.Fatalf("after Keep %d namespaces, want 6: %v", len(l), l)
	}
	names, err := Remove("pk-" + sb.ID)
	if err != nil || len(names) != 6 {
		t.Errorf("Remove: %v, %v; want 6 names", names, err)
	}
	if l := left(t, sb.ID); len(l) > 0 {
		t.Errorf("namespaces left after Remove: %v", l)
	}
	if names, err := Remove(sb.ID); err != nil || len(names) != 0 {
		t.Errorf("second Remove: %v, %v; want nothing", names, err)
	}
}

// TestEnterCgroup checks that the process moves into a new cgroup and
// back, and that the cgroup is gone afterwards.
func TestEnterCgroup(t *testing.T) {
	RequirePrivilege(t)
	own := func() string {
		b, err := os.ReadFile("/proc/self/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	before := own()
	cg, err := EnterCgroup("proxykit-sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(cg.Path()), "proxykit-sandbox-test-") || !strings.HasSuffix(own(), "/"+filepath.Base(cg.Path())) {
		t.Errorf("in cgroup %q, want %s", own(), cg.Path())
	}
	if err := cg.Leave(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Leave(); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if now := own(); now != before {
		t.Errorf("after Leave in %q, want %q", now, before)
	}
	if _, err := os.Stat(cg.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still exists: %v", cg.Path(), err)
	}
}

// TestNewCancelled checks that New does not build when ctx is done.
func TestNewCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sb, err := New(ctx, Options{}); !errors.Is(err, context.Canceled) || sb != nil {
		t.Errorf("New with a cancelled context: %v, %v", sb, err)
	}
}

// TestOutcomes checks the mapping of every outcome of the harness.
func TestOutcomes(t *testing.T) {
	for in, want := range map[testnet.Outcome]Outcome{
		testnet.Answered: Answered, testnet.Refused: Refused, testnet.Unreachable: Unreachable,
		testnet.Dropped: Dropped, testnet.TimedOut: TimedOut, testnet.Failed: Failed,
	} {
		if got := outcome(in); got != want || got.String() != in.String() {
			t.Errorf("outcome(%v) = %v, want %v", in, got, want)
		}
	}
	if Outcome(42).String() != "Outcome(42)" {
		t.Errorf("unknown outcome: %s", Outcome(42))
	}
	if _, err := Remove(""); err == nil {
		t.Error("Remove of an empty ID: no error")
	}
}
