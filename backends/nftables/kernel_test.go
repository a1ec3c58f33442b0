package nftables

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// These tests program a real kernel in namespaces they create and send
// real traffic through it. They need root.

const (
	shortWait = 400 * time.Millisecond
	longWait  = 2 * time.Second
)

var (
	pod1v4 = "10.0.1.2:8080"
	pod2v4 = "10.0.2.2:8080"
	pod1u4 = "10.0.1.2:5353"
	pod2u4 = "10.0.2.2:5353"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestKernel(t *testing.T) {
	requireRoot(t)
	topo := newTopology(t)

	t.Run("ClusterIP", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		tcp := clusterSvc("web", model.TCP, "10.96.0.10", 80, pod1v4)
		udp := clusterSvc("dns", model.UDP, "10.96.0.10", 53, pod1u4)
		mustSync(t, b, request(model.IPv4, []testSvc{tcp, udp}, nil))
		a, err := askTCP(topo.node, ap("10.96.0.10:80"), longWait)
		if err != nil || a.pod != "pod1" {
			t.Fatalf("TCP from node: %v %v", a, err)
		}
		a, err = askUDP(topo.node, ap("10.96.0.10:53"), longWait)
		if err != nil || a.pod != "pod1" {
			t.Fatalf("UDP from node: %v %v", a, err)
		}
		a, err = askTCP(topo.pod2, ap("10.96.0.10:80"), longWait)
		if err != nil || a.pod != "pod1" || a.src != netip.MustParseAddr("10.0.2.2") {
			t.Fatalf("TCP from pod2: %v %v (want pod1 seeing 10.0.2.2)", a, err)
		}
		// Another port on the cluster IP is rejected.
		if _, err := askTCP(topo.pod2, ap("10.96.0.10:81"), longWait); !isRefused(err) {
			t.Fatalf("unknown port: got %v, want connection refused", err)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("NoEndpointsRejects", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		tcp := clusterSvc("empty", model.TCP, "10.96.0.11", 80)
		udp := clusterSvc("empty-udp", model.UDP, "10.96.0.11", 53)
		mustSync(t, b, request(model.IPv4, []testSvc{tcp, udp}, nil))
		start := time.Now()
		if _, err := askTCP(topo.node, ap("10.96.0.11:80"), longWait); !isRefused(err) {
			t.Fatalf("TCP from node: got %v, want connection refused", err)
		}
		if _, err := askTCP(topo.pod1, ap("10.96.0.11:80"), longWait); !isRefused(err) {
			t.Fatalf("TCP from pod: got %v, want connection refused", err)
		}
		if _, err := askUDP(topo.pod1, ap("10.96.0.11:53"), longWait); !isRefused(err) {
			t.Fatalf("UDP from pod: got %v, want connection refused", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("rejects took %v", d)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("LocalWithoutLocalEndpointsDrops", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		s := clusterSvc("local", model.TCP, "10.96.0.12", 80)
		s.Port.InternalPolicy = model.PolicyLocal
		s.Targets.HasEndpoints = true
		mustSync(t, b, request(model.IPv4, []testSvc{s}, nil))
		if _, err := askTCP(topo.pod1, ap("10.96.0.12:80"), shortWait); !isTimeout(err) {
			t.Fatalf("got %v, want a timeout (drop)", err)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("SpreadAndIncremental", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		s := clusterSvc("spread", model.TCP, "10.96.0.13", 80, pod1v4)
		other := clusterSvc("other", model.TCP, "10.96.0.14", 80, pod2v4)
		mustSync(t, b, request(model.IPv4, []testSvc{s, other}, nil))
		if n := countPods(t, topo.node, ap("10.96.0.13:80"), 10); n["pod1"] != 10 {
			t.Fatalf("one endpoint: %v", n)
		}
		s2 := clusterSvc("spread", model.TCP, "10.96.0.13", 80, pod1v4, pod2v4)
		mustSync(t, b, request(model.IPv4, []testSvc{s2, other}, backendtest.Names(s2)))
		n := countPods(t, topo.node, ap("10.96.0.13:80"), 100)
		if n["pod1"] < 25 || n["pod2"] < 25 {
			t.Fatalf("two endpoints, 100 connections: %v", n)
		}
		// Remove the first endpoint: everything goes to pod2.
		s3 := clusterSvc("spread", model.TCP, "10.96.0.13", 80, pod2v4)
		mustSync(t, b, request(model.IPv4, []testSvc{s3, other}, backendtest.Names(s3)))
		if n := countPods(t, topo.node, ap("10.96.0.13:80"), 10); n["pod2"] != 10 {
			t.Fatalf("after removal: %v", n)
		}
		// Delete the service: its cluster IP is rejected, the other works.
		mustSync(t, b, request(model.IPv4, []testSvc{other}, backendtest.Names(s3)))
		if _, err := askTCP(topo.node, ap("10.96.0.13:80"), shortWait); err == nil {
			t.Fatal("deleted service still answers")
		}
		if n := countPods(t, topo.node, ap("10.96.0.14:80"), 3); n["pod2"] != 3 {
			t.Fatalf("other service: %v", n)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	// Replacing an endpoint replaces its range only: the kernel takes
	// the range deleted and added again between its kept neighbours,
	// traffic follows, and a full sync finds the map as it would write
	// it.
	t.Run("ReplaceEndpointInPlace", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		s := clusterSvc("swap", model.TCP, "10.96.0.15", 80, pod1v4)
		s.Port.NodePort = 30015
		var many []string
		for i := range 50 {
			many = append(many, fmt.Sprintf("10.0.9.%d:8080", i+1))
		}
		big := clusterSvc("big", model.TCP, "10.96.0.16", 80, many...)
		mustSync(t, b, request(model.IPv4, []testSvc{s, big}, nil))
		if n := countPods(t, topo.node, ap("10.96.0.15:80"), 5); n["pod1"] != 5 {
			t.Fatalf("before: %v", n)
		}
		s2 := clusterSvc("swap", model.TCP, "10.96.0.15", 80, pod2v4)
		s2.Port.NodePort = 30015
		many[20] = "10.0.9.200:8080"
		big2 := clusterSvc("big", model.TCP, "10.96.0.16", 80, many...)
		mustSync(t, b, request(model.IPv4, []testSvc{s2, big2}, backendtest.Names(s2, big2)))
		// swap: cluster and node port ranges, 4 elements each; big: 4;
		// hairpin: 2 each.
		if b.last.elems != 16 {
			t.Errorf("replacement wrote %d elements, want 16", b.last.elems)
		}
		if n := countPods(t, topo.node, ap("10.96.0.15:80"), 5); n["pod2"] != 5 {
			t.Fatalf("after the replacement: %v", n)
		}
		fingerprintChain := regexp.MustCompile(`\s*chain fingerprint-[0-9a-f]+ \{\s*\}`)
		list := func() string {
			t.Helper()
			out, err := topo.node.nft("list", "table", "ip", "proxykit")
			if err != nil {
				t.Fatal(out, err)
			}
			// Without the fingerprint chain (only the full sync has
			// one).
			return fingerprintChain.ReplaceAllString(out, "")
		}
		before := list()
		mustSync(t, b, request(model.IPv4, []testSvc{s2, big2}, nil))
		after := list()
		if before != after {
			t.Errorf("a full sync changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	// A big hairpin set has a size (here from 2 elements, in units of
	// 8); an incremental sync that would overfill it is made a full
	// one, which sizes it again; hairpin traffic is masqueraded
	// throughout.
	t.Run("HairpinSetSized", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		b.hairpinUnit = 8
		self := clusterSvc("self", model.TCP, "10.96.0.17", 80, pod1v4)
		others := []string{"10.0.9.1:8080", "10.0.9.2:8080", "10.0.9.3:8080"}
		other := clusterSvc("other", model.TCP, "10.96.0.18", 80, others...)
		size := func() string {
			t.Helper()
			out, err := topo.node.nft("list", "set", "ip", "proxykit", setHairpin)
			if err != nil {
				t.Fatal(out, err)
			}
			for l := range strings.Lines(out) {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "size" {
					return f[1]
				}
			}
			return "none"
		}
		hairpin := func() {
			t.Helper()
			a, err := askTCP(topo.pod1, ap("10.96.0.17:80"), longWait)
			if err != nil || a.pod != "pod1" || a.src != netip.MustParseAddr("10.0.1.1") {
				t.Fatalf("hairpin: %v %v, want pod1 seeing 10.0.1.1", a, err)
			}
		}
		mustSync(t, b, request(model.IPv4, []testSvc{self, other}, nil))
		if got := size(); got != "8" { // 4 elements
			t.Fatalf("size %s, want 8", got)
		}
		hairpin()
		// 4 more: 8 fit.
		others = append(others, "10.0.9.4:8080", "10.0.9.5:8080", "10.0.9.6:8080", "10.0.9.7:8080")
		other = clusterSvc("other", model.TCP, "10.96.0.18", 80, others...)
		mustSync(t, b, request(model.IPv4, []testSvc{self, other}, backendtest.Names(other)))
		if b.last.full || size() != "8" {
			t.Fatalf("8 elements: full sync %v, size %s; want an incremental one, size 8", b.last.full, size())
		}
		// A ninth: a full sync, size 16.
		others = append(others, "10.0.9.8:8080")
		other = clusterSvc("other", model.TCP, "10.96.0.18", 80, others...)
		mustSync(t, b, request(model.IPv4, []testSvc{self, other}, backendtest.Names(other)))
		if !b.last.full || size() != "16" {
			t.Fatalf("9 elements: full sync %v, size %s; want a full one, size 16", b.last.full, size())
		}
		hairpin()
		// A new process adopts the table, sized set included.
		b.Close()
		b = newTestBackend(t, topo.node, model.IPv4, Config{})
		b.hairpinUnit = 8
		mustSync(t, b, request(model.IPv4, []testSvc{self, other}, nil))
		if !b.last.adopted || b.st.hairpinSize != 16 {
			t.Fatalf("restart: adopted %v, size %d; want the table adopted, size 16", b.last.adopted, b.st.hairpinSize)
		}
		// Back to 1 element: the next full sync drops the size.
		mustSync(t, b, request(model.IPv4, []testSvc{self}, nil))
		if got := size(); got != "none" {
			t.Fatalf("1 element after a full sync: size %s, want none", got)
		}
		hairpin()
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("NodePortExternalIPLoadBalancer", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		cluster := clusterSvc("np", model.TCP, "10.96.1.1", 80, pod1v4)
		cluster.Port.NodePort = 30080
		cluster.Port.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.20")}
		local := clusterSvc("np-local", model.TCP, "10.96.1.2", 80, pod1v4, pod2v4)
		local.Port.NodePort = 30081
		local.Port.ExternalPolicy = model.PolicyLocal
		local.Targets.External = eps(pod2v4)
		lb := clusterSvc("lb", model.TCP, "10.96.1.3", 80, pod1v4)
		lb.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.10")}
		lb.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/25")}
		lbDeny := clusterSvc("lb-deny", model.TCP, "10.96.1.4", 80, pod1v4)
		lbDeny.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.11")}
		lbDeny.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
		localNone := clusterSvc("np-local-none", model.TCP, "10.96.1.5", 80, pod1v4)
		localNone.Port.NodePort = 30082
		localNone.Port.ExternalPolicy = model.PolicyLocal
		localNone.Targets.External = nil
		mustSync(t, b, request(model.IPv4, []testSvc{cluster, local, lb, lbDeny, localNone}, nil))

		// Policy Cluster: masqueraded to the node's address.
		a, err := askTCP(topo.client, ap("192.0.2.1:30080"), longWait)
		if err != nil || a.pod != "pod1" || a.src != netip.MustParseAddr("10.0.1.1") {
			t.Fatalf("node port (Cluster): %v %v, want pod1 seeing 10.0.1.1", a, err)
		}
		a, err = askTCP(topo.client, ap("198.51.100.20:80"), longWait)
		if err != nil || a.pod != "pod1" {
			t.Fatalf("external IP: %v %v", a, err)
		}
		// From the node itself.
		a, err = askTCP(topo.node, ap("10.0.2.1:30080"), longWait)
		if err != nil || a.pod != "pod1" {
			t.Fatalf("node port from the node: %v %v", a, err)
		}
		// Policy Local: the pod sees the client.
		for range 5 {
			a, err = askTCP(topo.client, ap("192.0.2.1:30081"), longWait)
			if err != nil || a.pod != "pod2" || a.src != netip.MustParseAddr("192.0.2.2") {
				t.Fatalf("node port (Local): %v %v, want pod2 seeing 192.0.2.2", a, err)
			}
		}
		// Policy Local without local endpoints: dropped.
		if _, err := askTCP(topo.client, ap("192.0.2.1:30082"), shortWait); !isTimeout(err) {
			t.Fatalf("node port (Local, no local endpoints): %v, want a timeout", err)
		}
		// Source ranges.
		if a, err := askTCP(topo.client, ap("203.0.113.10:80"), longWait); err != nil || a.pod != "pod1" {
			t.Fatalf("LB from an allowed source: %v %v", a, err)
		}
		if _, err := askTCP(topo.client, ap("203.0.113.11:80"), shortWait); !isTimeout(err) {
			t.Fatalf("LB from a denied source: %v, want a timeout", err)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("Masquerade", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{Config: proxier.Config{
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}})
		s := clusterSvc("masq", model.TCP, "10.96.2.1", 80, pod1v4)
		mustSync(t, b, request(model.IPv4, []testSvc{s}, nil))
		// From outside the cluster CIDR: masqueraded.
		a, err := askTCP(topo.client, ap("10.96.2.1:80"), longWait)
		if err != nil || a.src != netip.MustParseAddr("10.0.1.1") {
			t.Fatalf("from the client: %v %v, want source 10.0.1.1", a, err)
		}
		// From a pod: kept.
		a, err = askTCP(topo.pod2, ap("10.96.2.1:80"), longWait)
		if err != nil || a.src != netip.MustParseAddr("10.0.2.2") {
			t.Fatalf("from pod2: %v %v, want source 10.0.2.2", a, err)
		}
		// Hairpin: pod1 reaching itself is masqueraded, and works.
		a, err = askTCP(topo.pod1, ap("10.96.2.1:80"), longWait)
		if err != nil || a.pod != "pod1" || a.src != netip.MustParseAddr("10.0.1.1") {
			t.Fatalf("hairpin: %v %v, want pod1 seeing 10.0.1.1", a, err)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("Affinity", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		s := clusterSvc("sticky", model.TCP, "10.96.3.1", 80, pod1v4, pod2v4)
		s.Port.SessionAffinity = true
		s.Port.AffinityTimeout = 2 * time.Second
		mustSync(t, b, request(model.IPv4, []testSvc{s}, nil))
		n := countPods(t, topo.node, ap("10.96.3.1:80"), 20)
		if len(n) != 1 {
			t.Fatalf("affinity: %v, want one pod", n)
		}
		var first string
		for p := range n {
			first = p
		}
		// A full resync keeps the client pinned.
		mustSync(t, b, request(model.IPv4, []testSvc{s}, nil))
		if n := countPods(t, topo.node, ap("10.96.3.1:80"), 5); n[first] != 5 {
			t.Fatalf("after a full resync: %v, want %s", n, first)
		}
		// Its endpoint goes away: the client moves, and sticks again.
		rest := pod2v4
		if first == "pod2" {
			rest = pod1v4
		}
		s2 := clusterSvc("sticky", model.TCP, "10.96.3.1", 80, rest)
		s2.Port = s.Port
		mustSync(t, b, request(model.IPv4, []testSvc{s2}, backendtest.Names(s2)))
		n = countPods(t, topo.node, ap("10.96.3.1:80"), 3)
		if n[first] != 0 {
			t.Fatalf("after its endpoint left: %v", n)
		}
		mustSync(t, b, request(model.IPv4, []testSvc{s}, backendtest.Names(s)))
		if n := countPods(t, topo.node, ap("10.96.3.1:80"), 10); n[first] != 0 {
			t.Fatalf("with the endpoint back: %v, want the client to stay", n)
		}
		// The record expires after the timeout.
		shard, _ := groupOf(b.st.services[s.Port.Name].id, 0)
		if out, err := topo.node.nft("list", "set", "ip", "proxykit", affinitySet(shard)); err != nil || !strings.Contains(out, "expires") {
			t.Fatalf("no affinity record: %v\n%s", err, out)
		}
		time.Sleep(2500 * time.Millisecond)
		for _, sh := range []uint32{shard} {
			out, err := topo.node.nft("list", "set", "ip", "proxykit", affinitySet(sh))
			if err != nil {
				t.Fatal(out, err)
			}
			if strings.Contains(out, "expires") {
				t.Fatalf("affinity record outlived its timeout:\n%s", out)
			}
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("IPv6", func(t *testing.T) {
		b := newTestBackend(t, topo.node, model.IPv6, Config{})
		s := clusterSvc("web6", model.TCP, "fd00:96::10", 80, "[fd00:1::2]:8080", "[fd00:2::2]:8080")
		s.Port.NodePort = 30090
		u := clusterSvc("dns6", model.UDP, "fd00:96::10", 53, "[fd00:2::2]:5353")
		e := clusterSvc("empty6", model.TCP, "fd00:96::11", 80)
		sticky := clusterSvc("sticky6", model.TCP, "fd00:96::12", 80, "[fd00:1::2]:8080", "[fd00:2::2]:8080")
		sticky.Port.SessionAffinity = true
		mustSync(t, b, request(model.IPv6, []testSvc{s, u, e, sticky}, nil))
		if n := countPods(t, topo.pod1, ap("[fd00:96::10]:80"), 40); n["pod1"] < 5 || n["pod2"] < 5 {
			t.Fatalf("IPv6 spread: %v", n)
		}
		if a, err := askUDP(topo.node, ap("[fd00:96::10]:53"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("IPv6 UDP: %v %v", a, err)
		}
		// Masqueraded to the node's address towards the pod.
		a, err := askTCP(topo.client, ap("[2001:db8:1::1]:30090"), longWait)
		if want := map[string]string{"pod1": "fd00:1::1", "pod2": "fd00:2::1"}[a.pod]; err != nil || a.src.String() != want {
			t.Fatalf("IPv6 node port: %v %v, want the node's address", a, err)
		}
		if _, err := askTCP(topo.node, ap("[fd00:96::11]:80"), longWait); !isRefused(err) {
			t.Fatalf("IPv6 no endpoints: %v, want connection refused", err)
		}
		if n := countPods(t, topo.pod2, ap("[fd00:96::12]:80"), 10); len(n) != 1 {
			t.Fatalf("IPv6 affinity: %v", n)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	// The table holds the shard objects its service ports use and no
	// others, and a family without service ports has no table.
	t.Run("LayoutFollowsUse", func(t *testing.T) {
		b4 := newTestBackend(t, topo.node, model.IPv4, Config{})
		b6 := newTestBackend(t, topo.node, model.IPv6, Config{})
		objects := func() (chains, sets []string) {
			t.Helper()
			out, err := topo.node.nft("list", "table", "ip", "proxykit")
			if err != nil {
				t.Fatal(out, err)
			}
			for _, l := range strings.Split(out, "\n") {
				f := strings.Fields(l)
				if len(f) == 3 && f[2] == "{" {
					switch f[0] {
					case "chain":
						chains = append(chains, f[1])
					case "set", "map":
						sets = append(sets, f[1])
					}
				}
			}
			return chains, sets
		}
		shardObjs := func() []string {
			chains, sets := objects()
			var out []string
			for _, n := range slices.Concat(chains, sets) {
				for _, p := range []string{chainClusterPrefix, chainExternalPrefix, chainNodePortPrefix, setEndpointsPrefix, setAffinityPrefix} {
					if d, ok := strings.CutPrefix(n, p); ok && len(d) == 3 && strings.Trim(d, "0123456789") == "" {
						out = append(out, n)
					}
				}
			}
			slices.Sort(out)
			return out
		}
		a := clusterSvc("a", model.TCP, "10.96.8.1", 80, pod1v4)
		sticky := clusterSvc("sticky", model.TCP, "10.96.8.2", 80, pod1v4, pod2v4)
		sticky.Port.SessionAffinity = true
		np := clusterSvc("np", model.TCP, "10.96.8.3", 80, pod2v4)
		np.Port.NodePort = 30083
		mustSync(t, b4, request(model.IPv4, []testSvc{a}, nil))
		mustSync(t, b6, request(model.IPv6, nil, nil))
		id := func(s testSvc) uint32 { return b4.st.services[s.Port.Name].id }
		shard := func(s testSvc) uint32 { sh, _ := groupOf(id(s), 0); return sh }
		want := []string{sharedChain(chainClusterPrefix, shard(a)), endpointsMap(shard(a), 0)}
		slices.Sort(want)
		if got := shardObjs(); !slices.Equal(got, want) {
			t.Fatalf("one cluster IP service: shard objects %v, want %v", got, want)
		}
		if out, _ := topo.node.nft("list", "tables"); strings.Contains(out, "table ip6 proxykit") {
			t.Fatalf("an ip6 table without IPv6 service ports:\n%s", out)
		}
		// Incremental syncs add what new service ports use, and traffic
		// flows through it.
		mustSync(t, b4, request(model.IPv4, []testSvc{a, sticky, np}, backendtest.Names(sticky, np)))
		want = append(want, affinitySet(shard(sticky)), sharedChain(chainClusterPrefix, shard(np)),
			endpointsMap(shard(np), 0), sharedChain(chainNodePortPrefix, shard(np)))
		slices.Sort(want)
		if got := shardObjs(); !slices.Equal(got, want) {
			t.Fatalf("after adding affinity and node port services: shard objects %v, want %v", got, want)
		}
		if n := countPods(t, topo.pod1, ap("10.96.8.2:80"), 3); len(n) != 1 {
			t.Fatalf("affinity: %v", n)
		}
		if a, err := askTCP(topo.client, ap("192.0.2.1:30083"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("node port: %v %v", a, err)
		}
		// Removing them removes what nothing else uses.
		mustSync(t, b4, request(model.IPv4, []testSvc{a}, backendtest.Names(sticky, np)))
		want = []string{sharedChain(chainClusterPrefix, shard(a)), endpointsMap(shard(a), 0)}
		slices.Sort(want)
		if got := shardObjs(); !slices.Equal(got, want) {
			t.Fatalf("after removing them: shard objects %v, want %v", got, want)
		}
		if n := countPods(t, topo.node, ap("10.96.8.1:80"), 3); n["pod1"] != 3 {
			t.Fatalf("the remaining service: %v", n)
		}
		// A takeover by a new process deletes what the new state does
		// not use.
		mustSync(t, b4, request(model.IPv4, []testSvc{a, sticky, np}, backendtest.Names(sticky, np)))
		b4.Close()
		b4 = newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b4, request(model.IPv4, []testSvc{a}, nil))
		want = []string{sharedChain(chainClusterPrefix, shard(a)), endpointsMap(shard(a), 0)}
		slices.Sort(want)
		if got := shardObjs(); !slices.Equal(got, want) {
			t.Fatalf("after a takeover: shard objects %v, want %v", got, want)
		}
		// Without service ports the table goes; the next one brings it
		// back.
		mustSync(t, b4, request(model.IPv4, nil, backendtest.Names(a)))
		if out, _ := topo.node.nft("list", "tables"); strings.Contains(out, "table ip proxykit") {
			t.Fatalf("a table without service ports:\n%s", out)
		}
		mustSync(t, b4, request(model.IPv4, []testSvc{a}, backendtest.Names(a)))
		if n := countPods(t, topo.node, ap("10.96.8.1:80"), 3); n["pod1"] != 3 {
			t.Fatalf("after the table came back: %v", n)
		}
		// A service range of the family is enough for a table: its
		// unallocated addresses are dropped.
		req6 := request(model.IPv6, nil, nil)
		req6.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}
		mustSync(t, b6, req6)
		if out, _ := topo.node.nft("list", "tables"); !strings.Contains(out, "table ip6 proxykit") {
			t.Fatalf("no ip6 table for an IPv6 service range:\n%s", out)
		}
		cleanupAndCheck(t, b4, topo.node)
		cleanupAndCheck(t, b6, topo.node)
	})

	t.Run("CoexistenceAndCleanup", func(t *testing.T) {
		if out, err := topo.node.nft("add table inet other; add chain inet other c { type filter hook input priority 0; }; add rule inet other c counter"); err != nil {
			t.Fatal(out, err)
		}
		b4 := newTestBackend(t, topo.node, model.IPv4, Config{})
		b6 := newTestBackend(t, topo.node, model.IPv6, Config{})
		mustSync(t, b4, request(model.IPv4, []testSvc{clusterSvc("a", model.TCP, "10.96.4.1", 80, pod1v4)}, nil))
		mustSync(t, b6, request(model.IPv6, []testSvc{clusterSvc("a", model.TCP, "fd00:96::41", 80, "[fd00:1::2]:8080")}, nil))
		mustSync(t, b4, request(model.IPv4, []testSvc{clusterSvc("a", model.TCP, "10.96.4.1", 80, pod1v4)}, nil))
		cleanupAndCheck(t, b4, topo.node)
		if out, _ := topo.node.nft("list", "tables"); !strings.Contains(out, "table ip6 proxykit") {
			t.Fatalf("IPv4 cleanup removed the IPv6 table:\n%s", out)
		}
		cleanupAndCheck(t, b6, topo.node)
		out, err := topo.node.nft("list", "table", "inet", "other")
		if err != nil || !strings.Contains(out, "counter") {
			t.Fatalf("the other table did not survive: %v\n%s", err, out)
		}
		// Cleanup without a table succeeds.
		if err := b4.Cleanup(t.Context()); err != nil {
			t.Fatal(err)
		}
		topo.node.nft("delete", "table", "inet", "other")
	})

	t.Run("RestartKeepsConnections", func(t *testing.T) {
		s := clusterSvc("restart", model.TCP, "10.96.5.1", 80, pod1v4)
		b1 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b1, request(model.IPv4, []testSvc{s}, nil))
		conn := dialKeep(t, topo.pod2, ap("10.96.5.1:80"))
		b1.Close()
		// A new process replaces the table in one transaction.
		b2 := newTestBackend(t, topo.node, model.IPv4, Config{})
		other := clusterSvc("other", model.TCP, "10.96.5.2", 80, pod2v4)
		mustSync(t, b2, request(model.IPv4, []testSvc{s, other}, nil))
		if got := conn.roundTrip(t, "ping"); got != "pod1 ping" {
			t.Fatalf("established connection after restart: %q", got)
		}
		// Deleted behind our back: a full resync restores it.
		if out, err := topo.node.nft("delete", "table", "ip", "proxykit"); err != nil {
			t.Fatal(out, err)
		}
		mustSync(t, b2, request(model.IPv4, []testSvc{s, other}, nil))
		if a, err := askTCP(topo.pod2, ap("10.96.5.2:80"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("after restoring the table: %v %v", a, err)
		}
		cleanupAndCheck(t, b2, topo.node)
	})

	t.Run("DeletedTableFailsPartialSync", func(t *testing.T) {
		// A partial sync after the table was deleted behind the
		// backend's back is a failed sync, not a service port the
		// kernel rejected; the full sync that follows restores it.
		a := clusterSvc("a", model.TCP, "10.96.5.5", 80, pod1v4)
		c := clusterSvc("c", model.TCP, "10.96.5.6", 80, pod2v4)
		c.Port.SessionAffinity = true // a chain of its own
		c.Port.AffinityTimeout = time.Minute
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b, request(model.IPv4, []testSvc{a, c}, nil))
		if out, err := topo.node.nft("delete", "table", "ip", "proxykit"); err != nil {
			t.Fatal(out, err)
		}
		// Each change alone: an endpoint added (shared maps), a
		// service port's own chain rewritten (messages that belong to
		// it alone).
		a2 := clusterSvc("a", model.TCP, "10.96.5.5", 80, pod1v4, pod2v4)
		c2 := clusterSvc("c", model.TCP, "10.96.5.6", 80, pod2v4)
		c2.Port.SessionAffinity = true
		c2.Port.AffinityTimeout = 2 * time.Minute
		for _, req := range []*proxier.SyncRequest{
			request(model.IPv4, []testSvc{a2, c}, backendtest.Names(a2)),
			request(model.IPv4, []testSvc{a, c2}, backendtest.Names(c2)),
		} {
			err := b.Sync(t.Context(), req)
			if err == nil || proxier.OnlyObjectErrors(err) || !errors.Is(err, proxier.ErrNotApplied) {
				t.Fatalf("partial sync of %v without the table: %v; want a failed sync that applied nothing", slices.Collect(maps.Keys(req.Changed)), err)
			}
		}
		req := request(model.IPv4, []testSvc{a2, c2}, nil)
		req.Full = true
		mustSync(t, b, req)
		if n := countPods(t, topo.node, ap("10.96.5.5:80"), 40); n["pod1"] == 0 || n["pod2"] == 0 {
			t.Fatalf("after the full sync: %v", n)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("TakeOverInPlace", func(t *testing.T) {
		// A new process takes the table over without deleting it:
		// the chains of service ports that are gone go, the table
		// stays (its handle does not change).
		gone := clusterSvc("gone", model.TCP, "10.96.5.3", 80, pod1v4)
		gone.Port.SessionAffinity = true // a chain of its own
		gone.Port.AffinityTimeout = 60 * time.Second
		kept := clusterSvc("kept", model.TCP, "10.96.5.4", 80, pod2v4)
		b1 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b1, request(model.IPv4, []testSvc{gone, kept}, nil))
		before, err := topo.node.nft("-a", "list", "table", "ip", "proxykit")
		if err != nil || !strings.Contains(before, svcChain(gone.Port.Name)) {
			t.Fatalf("before: %v\n%s", err, before)
		}
		b1.Close()
		b2 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b2, request(model.IPv4, []testSvc{kept}, nil))
		after, err := topo.node.nft("-a", "list", "table", "ip", "proxykit")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(after, svcChain(gone.Port.Name)) {
			t.Errorf("the chain of a service port that is gone survived the take-over:\n%s", after)
		}
		if h1, h2 := strings.SplitN(before, "\n", 2)[0], strings.SplitN(after, "\n", 2)[0]; h1 != h2 {
			t.Errorf("the table was replaced: %q, then %q", h1, h2)
		}
		if a, err := askTCP(topo.pod1, ap("10.96.5.4:80"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("after the take-over: %v %v", a, err)
		}
		if _, err := askTCP(topo.pod1, ap("10.96.5.3:80"), shortWait); err == nil {
			t.Fatal("a service that is gone still answers")
		}
		cleanupAndCheck(t, b2, topo.node)
	})

	t.Run("TakeOverDifferingTableReplaces", func(t *testing.T) {
		// A table of the same name whose set has another type (an
		// earlier version's): taking it over in place fails, so the
		// table is replaced, in one transaction.
		if out, err := topo.node.nft("add table ip proxykit; add set ip proxykit cluster-ips { type inet_service; }; add chain ip proxykit leftover"); err != nil {
			t.Fatal(out, err)
		}
		kept := clusterSvc("kept", model.TCP, "10.96.5.4", 80, pod2v4)
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b, request(model.IPv4, []testSvc{kept}, nil))
		out, err := topo.node.nft("list", "table", "ip", "proxykit")
		if err != nil || strings.Contains(out, "leftover") || strings.Contains(out, "inet_service;") {
			t.Fatalf("the earlier table was not replaced: %v\n%s", err, out)
		}
		if a, err := askTCP(topo.pod1, ap("10.96.5.4:80"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("after replacing: %v %v", a, err)
		}
		cleanupAndCheck(t, b, topo.node)
	})

	t.Run("AdoptsMatchingTable", func(t *testing.T) {
		// A new process whose first sync would write what the table
		// holds adopts it: nothing is written (every handle stays),
		// and it goes on incrementally from what it rendered.
		a := clusterSvc("adopt-a", model.TCP, "10.96.5.7", 80, pod1v4)
		sticky := clusterSvc("adopt-sticky", model.TCP, "10.96.5.8", 80, pod2v4)
		sticky.Port.SessionAffinity = true // a chain and an affinity set
		sticky.Port.AffinityTimeout = time.Minute
		b1 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b1, request(model.IPv4, []testSvc{a, sticky}, nil))
		before := listWithHandles(t, topo.node)
		if !strings.Contains(before, "chain "+fingerprintPrefix) {
			t.Fatalf("no fingerprint chain after a full sync:\n%s", before)
		}
		b1.Close()
		b2 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b2, request(model.IPv4, []testSvc{a, sticky}, nil))
		if !b2.last.adopted || b2.last.messages != 0 {
			t.Errorf("second process's first sync: %+v; want the table adopted", b2.last)
		}
		if after := listWithHandles(t, topo.node); after != before {
			t.Errorf("the adopted table was rewritten:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if a, err := askTCP(topo.pod2, ap("10.96.5.8:80"), longWait); err != nil || a.pod != "pod2" {
			t.Fatalf("after adopting: %v %v", a, err)
		}
		// An incremental sync from the adopted state: the endpoint
		// added gets traffic, and the fingerprint goes.
		a2 := clusterSvc("adopt-a", model.TCP, "10.96.5.7", 80, pod2v4)
		mustSync(t, b2, request(model.IPv4, []testSvc{a2, sticky}, backendtest.Names(a2)))
		if n := countPods(t, topo.node, ap("10.96.5.7:80"), 5); n["pod2"] != 5 {
			t.Fatalf("after an incremental sync of the adopted table: %v", n)
		}
		changed := listWithHandles(t, topo.node)
		if strings.Contains(changed, "chain "+fingerprintPrefix) {
			t.Fatalf("the fingerprint chain survived an incremental sync:\n%s", changed)
		}
		// So a process started now takes the table over, although it
		// renders the same state.
		b2.Close()
		b3 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b3, request(model.IPv4, []testSvc{a2, sticky}, nil))
		if b3.last.adopted {
			t.Errorf("a table changed incrementally since its fingerprint was adopted")
		}
		if after := listWithHandles(t, topo.node); after == changed {
			t.Errorf("the table was not rewritten after an incremental sync:\n%s", after)
		}
		// The full sync wrote a fingerprint again; a periodic full sync
		// rewrites the table even so.
		b3.Close()
		b4 := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b4, request(model.IPv4, []testSvc{a2, sticky}, nil))
		if !b4.last.adopted {
			t.Errorf("the table a full sync wrote was not adopted")
		}
		adopted := listWithHandles(t, topo.node)
		req := request(model.IPv4, []testSvc{a2, sticky}, nil)
		req.Full = true
		mustSync(t, b4, req)
		if b4.last.adopted || listWithHandles(t, topo.node) == adopted {
			t.Errorf("a later full sync did not rewrite the table")
		}
		if n := countPods(t, topo.node, ap("10.96.5.7:80"), 5); n["pod2"] != 5 {
			t.Fatalf("after the full sync: %v", n)
		}
		cleanupAndCheck(t, b4, topo.node)
	})

	t.Run("TakesOverMismatchingTable", func(t *testing.T) {
		// A table that holds something else than the first sync would
		// write is taken over, even with a fingerprint.
		a := clusterSvc("mismatch-a", model.TCP, "10.96.5.9", 80, pod1v4)
		b := clusterSvc("mismatch-b", model.TCP, "10.96.5.10", 80, pod2v4)
		for _, tc := range []struct {
			name string
			edit func(t *testing.T)
			// want is what the second process programs.
			want []testSvc
		}{
			{name: "OtherState", want: []testSvc{a}},
			{name: "ChainAdded", want: []testSvc{a, b}, edit: func(t *testing.T) {
				if out, err := topo.node.nft("add", "chain", "ip", "proxykit", "hand-made"); err != nil {
					t.Fatal(out, err)
				}
			}},
			{name: "FingerprintDeleted", want: []testSvc{a, b}, edit: func(t *testing.T) {
				for _, l := range strings.Split(listWithHandles(t, topo.node), "\n") {
					if f := strings.Fields(l); len(f) >= 2 && f[0] == "chain" && isFingerprint(f[1]) {
						if out, err := topo.node.nft("delete", "chain", "ip", "proxykit", f[1]); err != nil {
							t.Fatal(out, err)
						}
					}
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b1 := newTestBackend(t, topo.node, model.IPv4, Config{})
				mustSync(t, b1, request(model.IPv4, []testSvc{a, b}, nil))
				b1.Close()
				if tc.edit != nil {
					tc.edit(t)
				}
				before := listWithHandles(t, topo.node)
				b2 := newTestBackend(t, topo.node, model.IPv4, Config{})
				mustSync(t, b2, request(model.IPv4, tc.want, nil))
				after := listWithHandles(t, topo.node)
				if b2.last.adopted || after == before {
					t.Fatalf("a table that differs was adopted (%+v):\n%s", b2.last, after)
				}
				if strings.Contains(after, "hand-made") || strings.Count(after, "chain "+fingerprintPrefix) != 1 {
					t.Errorf("after the take-over, a hand-made chain or not one fingerprint chain:\n%s", after)
				}
				if n := countPods(t, topo.node, ap("10.96.5.9:80"), 3); n["pod1"] != 3 {
					t.Fatalf("after the take-over: %v", n)
				}
				_, err := askTCP(topo.node, ap("10.96.5.10:80"), shortWait)
				if gone := len(tc.want) == 1; gone != (err != nil) {
					t.Fatalf("service b (wanted: %v): %v", !gone, err)
				}
				cleanupAndCheck(t, b2, topo.node)
			})
		}
	})

	t.Run("NftListsRuleset", func(t *testing.T) {
		// Operators debug with `nft list ruleset`: nft (1.0.6 here) must
		// be able to print every rule the backend writes, affinity
		// rules and chains of their own included.
		testnet.RequireCommand(t, "nft")
		b4 := newTestBackend(t, topo.node, model.IPv4, Config{Config: proxier.Config{
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}})
		b6 := newTestBackend(t, topo.node, model.IPv6, Config{})
		sticky := clusterSvc("sticky", model.TCP, "10.96.7.1", 80, pod1v4, pod2v4)
		sticky.Port.SessionAffinity = true
		sticky.Port.NodePort = 30071
		local := clusterSvc("local", model.TCP, "10.96.7.2", 80, pod1v4, pod2v4)
		local.Port.NodePort = 30072
		local.Port.ExternalPolicy = model.PolicyLocal
		local.Targets.External = eps(pod2v4)
		lb := clusterSvc("lb", model.UDP, "10.96.7.3", 53, pod1u4)
		lb.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.70")}
		lb.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		empty := clusterSvc("empty", model.TCP, "10.96.7.4", 80)
		mustSync(t, b4, request(model.IPv4, []testSvc{sticky, local, lb, empty}, nil))
		sticky6 := clusterSvc("sticky6", model.TCP, "fd00:96::71", 80, "[fd00:1::2]:8080", "[fd00:2::2]:8080")
		sticky6.Port.SessionAffinity = true
		plain6 := clusterSvc("plain6", model.TCP, "fd00:96::72", 80, "[fd00:1::2]:8080")
		plain6.Port.NodePort = 30073
		mustSync(t, b6, request(model.IPv6, []testSvc{sticky6, plain6}, nil))
		// Traffic, so that affinity sets hold records.
		if n := countPods(t, topo.pod2, ap("10.96.7.1:80"), 3); len(n) != 1 {
			t.Fatalf("affinity: %v", n)
		}
		out, err := topo.node.nft("list", "ruleset")
		if err != nil || strings.Contains(out, "Error") {
			t.Fatalf("nft list ruleset: %v\n%s", err, out)
		}
		for _, want := range []string{"table ip proxykit", "table ip6 proxykit", "update @affinity-", "expires", "numgen random mod 65535 map @endpoints-", "jhash ip6 daddr"} {
			if !strings.Contains(out, want) {
				t.Errorf("nft list ruleset lacks %q:\n%s", want, out)
			}
		}
		// The listing loads back with nft -f: no chain or set is named
		// like a keyword (a chain named "reject" was, which broke every
		// reload), and every rule but two kinds reads back. Those two
		// build a lookup key from a constant and packet fields, which
		// nft prints but cannot type-check again: the endpoint picks
		// (`... numgen random mod 65535 map @endpoints-N`, a 16-byte
		// interval key that a typed concatenation would turn into a
		// pipapo set, whose every commit copies the whole set) and the
		// session affinity rules (`AID . ip saddr @affinity-N`).
		var kept []string
		left := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "map @endpoints-") || strings.Contains(l, " @affinity-") {
				left++
				continue
			}
			kept = append(kept, l)
		}
		f := filepath.Join(t.TempDir(), "ruleset.nft")
		if err := os.WriteFile(f, []byte("flush ruleset\n"+strings.Join(kept, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		if res, err := topo.node.nft("-f", f); err != nil {
			t.Fatalf("nft -f of the listing: %v\n%s", err, res)
		}
		if again, err := topo.node.nft("list", "ruleset"); err != nil || !strings.Contains(again, "goto reject-chain") || !strings.Contains(again, "firewall-allow") {
			t.Fatalf("the reloaded ruleset lacks rules: %v\n%.3000s", err, again)
		}
		t.Logf("the listing loads back with nft -f, all but %d endpoint-pick and affinity rules", left)
		cleanupAndCheck(t, b4, topo.node)
		cleanupAndCheck(t, b6, topo.node)
	})

	t.Run("SCTPRulesAccepted", func(t *testing.T) {
		// The kernel here has SCTP conntrack and NAT but no SCTP sockets:
		// check that the rules go in and dispatch on protocol 132.
		b := newTestBackend(t, topo.node, model.IPv4, Config{})
		mustSync(t, b, request(model.IPv4, []testSvc{clusterSvc("sctp", model.SCTP, "10.96.6.1", 80, "10.0.1.2:9999")}, nil))
		out, err := topo.node.nft("list", "map", "ip", "proxykit", setServiceIPs)
		if err != nil || !strings.Contains(out, "10.96.6.1 . sctp . 80") {
			t.Fatalf("SCTP dispatch element missing: %v\n%s", err, out)
		}
		cleanupAndCheck(t, b, topo.node)
	})
}

// keptConn is a TCP connection kept open across syncs.
type keptConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialKeep(t *testing.T, from *testNS, addr netip.AddrPort) *keptConn {
	t.Helper()
	var c net.Conn
	err := from.ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr.String(), longWait)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k := &keptConn{c: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(longWait))
	if _, err := k.r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *keptConn) roundTrip(t *testing.T, msg string) string {
	t.Helper()
	k.c.SetDeadline(time.Now().Add(longWait))
	if _, err := k.c.Write([]byte(msg + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := k.r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// countPods opens n connections and counts the pods that answered.
func countPods(t *testing.T, from *testNS, addr netip.AddrPort, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for range n {
		a, err := askTCP(from, addr, longWait)
		if err != nil {
			t.Fatalf("connect %s: %v", addr, err)
		}
		out[a.pod]++
	}
	return out
}

// cleanupAndCheck runs Cleanup and checks that the table is gone.
// listWithHandles returns `nft -a list table ip proxykit`: the table
// with the handle of every chain, set and rule, which a rewrite changes.
func listWithHandles(t *testing.T, ns *testNS) string {
	t.Helper()
	out, err := ns.nft("-a", "list", "table", "ip", "proxykit")
	if err != nil {
		t.Fatal(out, err)
	}
	return out
}

func cleanupAndCheck(t *testing.T, b proxier.Backend, ns *testNS) {
	t.Helper()
	if err := b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	out, err := ns.nft("list", "tables")
	if err != nil {
		t.Fatal(out, err)
	}
	table := "table ip proxykit\n"
	if b.Family() == model.IPv6 {
		table = "table ip6 proxykit\n"
	}
	if strings.Contains(out, table) {
		t.Fatalf("table left after cleanup:\n%s", out)
	}
}

func TestNewFailsOnMissingNamespace(t *testing.T) {
	_, err := NewBackend(Config{Config: proxier.Config{NetNS: "/nonexistent/netns"}}, model.IPv4)
	if err == nil {
		t.Fatal("NewBackend with a missing namespace succeeded")
	}
	if _, err := NewBackend(Config{MasqueradeBit: 0x3}, model.IPv4); err == nil {
		t.Fatal("a two-bit masquerade mark was accepted")
	}
}

func TestNewProxier(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	p, err := New(Config{Config: proxier.Config{NetNS: ns.path}})
	if err != nil {
		// The engine may not be there yet; the backends must not leak.
		t.Logf("New: %v", err)
		return
	}
	p.Close()
}

// TestNewSecondProxierRefused checks that a second proxier of the same
// table in one namespace is refused at New, while one of another table is
// not, and that the table is free again once the first is closed.
func TestNewSecondProxierRefused(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	cfg := Config{Config: proxier.Config{NetNS: ns.path}}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg)
	if !errors.Is(err, ownerlock.ErrHeld) || !strings.Contains(err.Error(), "table ip proxykit") {
		t.Fatalf("second proxier of the same table: %v; want it refused as held", err)
	}
	other := cfg
	other.TableName = "other"
	p, err := New(other)
	if err != nil {
		t.Fatalf("proxier of another table: %v", err)
	}
	p.Close()
	first.Close()
	again, err := New(cfg)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	again.Close()
}
