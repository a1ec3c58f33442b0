package testnet_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestHandWrittenDNAT sanity-checks what the conformance suite relies on,
// with a service proxy written by hand in nft rules in node1: DNAT of TCP,
// UDP and SCTP from the client, the node and a pod; masquerade and seen
// sources; hairpin; rejects seen as refused and drops as timeouts (from a
// pod) or EPERM (from the node); a stale UDP conntrack entry outliving a
// rule change until it is deleted; an established connection outliving
// the rules.
func TestHandWrittenDNAT(t *testing.T) {
	t.Parallel()
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "conntrack")
	for _, f := range families {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			handDNAT(t, testnet.New(t, testnet.Options{}), f)
		})
	}
}

func handDNAT(t *testing.T, tp *testnet.Topology, f model.IPFamily) {
	ctx := context.Background()
	ip, vip, rejectIP, dropIP := "ip", "10.96.0.10", "10.96.0.11", "10.96.0.12"
	if f == model.IPv6 {
		ip, vip, rejectIP, dropIP = "ip6", "fd00:10:96::10", "fd00:10:96::11", "fd00:10:96::12"
	}
	pod1, pod2, pod3 := tp.Node1.Pods[0], tp.Node1.Pods[1], tp.Node1.Pods[2]
	remote1, remote2 := tp.Node2.Pods[0], tp.Node2.Pods[1]
	to := func(p *testnet.Pod, port uint16) string { return netip.AddrPortFrom(p.IP(f), port).String() }
	table := "pktest" + f.String()
	rules := fmt.Sprintf(`
table inet %[1]s {
	chain svc {
		%[2]s daddr %[3]s tcp dport 80 dnat %[2]s to %[4]s
		%[2]s daddr %[3]s tcp dport 90 dnat %[2]s to %[5]s
		%[2]s daddr %[3]s sctp dport 80 dnat %[2]s to %[6]s
		%[2]s daddr %[3]s udp dport 80 goto udpsvc
	}
	chain udpsvc {
		meta l4proto udp dnat %[2]s to %[7]s
	}
	chain pre { type nat hook prerouting priority dstnat; policy accept; jump svc; }
	chain out { type nat hook output priority -100; policy accept; jump svc; }
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat %[2]s saddr %[8]s %[2]s daddr %[8]s masquerade
		ct status dnat oifname "node2" %[2]s saddr != %[9]s masquerade
	}
	chain block {
		%[2]s daddr %[10]s reject
		%[2]s daddr %[11]s drop
	}
	chain ffwd { type filter hook forward priority filter; policy accept; jump block; }
	chain fout { type filter hook output priority filter; policy accept; jump block; }
}
`, table, ip, vip, to(pod1, 8080), to(pod1, testnet.EchoPort), to(pod2, 8082), to(remote1, 8081),
		pod1.IP(f), testnet.PodNetwork(f), rejectIP, dropIP)
	if _, err := tp.Node1.ExecInput(ctx, rules, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	svc := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(vip), port) }

	// TCP from outside, from a pod, from the node, and hairpin.
	expect(t, "client tcp", tp.Client.TCP(svc(80), timeout), "tcp", pod1.Name, 8080, tp.Client.IP(f))
	expect(t, "pod tcp", pod3.TCP(svc(80), timeout), "tcp", pod1.Name, 8080, pod3.IP(f))
	// The node's route to the service address is its default route, so
	// its packets carry its uplink address unless masqueraded.
	expect(t, "node tcp", tp.Node1.TCP(svc(80), timeout), "tcp", pod1.Name, 8080, tp.Node1.UplinkIP(f))
	expect(t, "hairpin tcp", pod1.TCP(svc(80), timeout), "tcp", pod1.Name, 8080, tp.Node1.Gateway(f))

	// UDP to a remote endpoint: masqueraded from outside, not from a pod.
	expect(t, "client udp", tp.Client.UDP(svc(80), timeout), "udp", remote1.Name, 8081, tp.Node1.IP(f))
	expect(t, "pod udp", pod3.UDP(svc(80), timeout), "udp", remote1.Name, 8081, pod3.IP(f))

	// SCTP: the INIT is DNATed (port rewritten, checksum recomputed by
	// the kernel and verified by the receiver).
	for _, from := range []*testnet.Host{tp.Client, &tp.Node1.Host, &pod3.Host} {
		src := from.IP(f)
		if from == &tp.Node1.Host {
			src = tp.Node1.UplinkIP(f)
		}
		r := from.SCTPInit(svc(80), timeout)
		expect(t, from.Name+" sctp", r, "sctp", pod2.Name, 8082, src)
	}

	// Rejects and drops. A rejected IPv6 TCP connect fails only when the
	// retransmitted SYN draws the second ICMPv6 error, a second later:
	// that kernel ignores the first.
	for _, from := range []*testnet.Host{tp.Client, &pod3.Host, &tp.Node1.Host} {
		if r := from.TCP(netip.AddrPortFrom(netip.MustParseAddr(rejectIP), 80), 3*time.Second); r.Outcome != testnet.Refused || r.Elapsed > 1500*time.Millisecond {
			t.Errorf("%s tcp to rejected address: %v, want refused at once", from.Name, r)
		}
		if r := from.UDP(netip.AddrPortFrom(netip.MustParseAddr(rejectIP), 80), timeout); r.Outcome != testnet.Refused {
			t.Errorf("%s udp to rejected address: %v, want refused", from.Name, r)
		}
	}
	for _, from := range []*testnet.Host{tp.Client, &pod3.Host, &tp.Node1.Host} {
		if r := from.TCP(netip.AddrPortFrom(netip.MustParseAddr(dropIP), 80), 500*time.Millisecond); r.Outcome != testnet.TimedOut {
			t.Errorf("%s tcp to dropped address: %v, want timed out", from.Name, r)
		}
	}
	// From the node itself a dropped datagram fails the write (EPERM).
	if r := tp.Node1.UDP(netip.AddrPortFrom(netip.MustParseAddr(dropIP), 80), 500*time.Millisecond); r.Outcome != testnet.Dropped || !r.Outcome.Silent() {
		t.Errorf("node udp to dropped address: %v, want dropped (EPERM)", r)
	}
	if r := pod3.UDP(netip.AddrPortFrom(netip.MustParseAddr(dropIP), 80), 500*time.Millisecond); r.Outcome != testnet.TimedOut {
		t.Errorf("pod udp to dropped address: %v, want timed out", r)
	}

	// A UDP flow keeps its conntrack entry, and so its endpoint, across a
	// rule change until the entry is deleted.
	s, err := pod3.UDPSocket(svc(80))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	expect(t, "udp socket", s.Query(timeout), "udp", remote1.Name, 8081, pod3.IP(f))
	if _, err := tp.Node1.Exec(ctx, "nft", "flush chain inet "+table+" udpsvc; add rule inet "+table+" udpsvc meta l4proto udp dnat "+ip+" to "+to(remote2, 8081)); err != nil {
		t.Fatal(err)
	}
	expect(t, "udp socket, stale entry", s.Query(timeout), "udp", remote1.Name, 8081, pod3.IP(f))
	expect(t, "new udp socket", pod3.UDP(svc(80), timeout), "udp", remote2.Name, 8081, pod3.IP(f))
	ctFamily := "ipv4"
	if f == model.IPv6 {
		ctFamily = "ipv6"
	}
	if _, err := tp.Node1.Exec(ctx, "conntrack", "-D", "-f", ctFamily, "-p", "udp", "--orig-dst", vip); err != nil {
		t.Fatal(err)
	}
	expect(t, "udp socket, entry deleted", s.Query(timeout), "udp", remote2.Name, 8081, pod3.IP(f))

	// An established connection keeps its NAT binding when its rule goes,
	// as long as a nat chain is still hooked: without any, the kernel
	// does not translate even established flows.
	c, err := tp.Client.DialTCP(svc(90), timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := testnet.Echo(c, "before", timeout); err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Node1.Exec(ctx, "nft", "flush", "chain", "inet", table, "svc"); err != nil {
		t.Fatal(err)
	}
	if err := testnet.Echo(c, "after", timeout); err != nil {
		t.Errorf("established connection after its rule went: %v", err)
	}
	if r := tp.Client.TCP(svc(90), 500*time.Millisecond); r.Outcome == testnet.Answered {
		t.Errorf("new connection without a rule: %v", r)
	}
	if _, err := tp.Node1.Exec(ctx, "nft", "delete", "table", "inet", table); err != nil {
		t.Fatal(err)
	}
	out, err := tp.Node1.Exec(ctx, "nft", "list", "ruleset")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("node1 ruleset after delete: %q, %v", out, err)
	}
}
