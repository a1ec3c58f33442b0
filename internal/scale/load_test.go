package scale

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestKubeProxyNFTLoads loads the kube-proxy nftables reference into
// node1 with `nft -f` and checks that its filter side is there and acts
// as kube-proxy's: a new connection through node1 to a cluster IP on a
// port no service has is rejected (cluster-ips-check), which without the
// table goes to node1's uplink and is lost.
func TestKubeProxyNFTLoads(t *testing.T) {
	testnet.RequireCommand(t, "nft")
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	svcs := Services(50, 2)
	wrongPort := netip.AddrPortFrom(svcs[7].ClusterIP, Port+1)
	if r := tp.Client.TCP(wrongPort, time.Second); !r.Outcome.Silent() {
		t.Fatalf("before loading: %v to %v, want it lost", r, wrongPort)
	}
	if out, err := tp.Node1.ExecInput(t.Context(), KubeProxyNFT(svcs), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	out, err := tp.Node1.Exec(t.Context(), "nft", "list", "table", "ip", NFTTable)
	if err != nil {
		t.Fatal(err)
	}
	chains := nftChains(out)
	for _, bc := range nftFilterChains {
		hook := "type filter hook " + bc.hook + " priority "
		if got := chains[bc.name]; !strings.Contains(got, hook) || !strings.Contains(got, "ct state new jump ") {
			t.Errorf("chain %s: %q, want a %s base chain with ct state new jumps", bc.name, got, bc.hook)
		}
	}
	for _, c := range append(nftCheckChains, "reject-chain") {
		if _, ok := chains[c]; !ok {
			t.Errorf("no chain %s", c)
		}
	}
	if !strings.Contains(chains["filter-forward"], "jump service-endpoints-check") || !strings.Contains(chains["filter-forward"], "jump cluster-ips-check") {
		t.Errorf("filter-forward: %q", chains["filter-forward"])
	}
	if !strings.Contains(chains["cluster-ips-check"], "ip daddr "+ServiceCIDR+" drop") {
		t.Errorf("cluster-ips-check: %q", chains["cluster-ips-check"])
	}
	for _, ip := range []netip.Addr{svcs[0].ClusterIP, svcs[49].ClusterIP} {
		if _, err := tp.Node1.Exec(t.Context(), "nft", "get", "element", "ip", NFTTable, "cluster-ips", "{", ip.String(), "}"); err != nil {
			t.Errorf("cluster-ips lacks %s: %v", ip, err)
		}
	}
	for _, m := range []string{"no-endpoint-services", "no-endpoint-nodeports", "firewall-ips"} {
		out, err := tp.Node1.Exec(t.Context(), "nft", "list", "map", "ip", NFTTable, m)
		if err != nil || strings.Contains(out, "elements") {
			t.Errorf("map %s: %v\n%s", m, err, out)
		}
	}
	if r := tp.Client.TCP(wrongPort, 2*time.Second); !r.Outcome.Rejected() {
		t.Errorf("%v to %v, want it rejected by cluster-ips-check", r, wrongPort)
	}
}

// nftChains returns the body of each chain of an `nft list table`.
func nftChains(listing string) map[string]string {
	out := map[string]string{}
	var name string
	var body strings.Builder
	for l := range strings.SplitSeq(listing, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "chain ") && strings.HasSuffix(l, " {"):
			name = strings.TrimSuffix(strings.TrimPrefix(l, "chain "), " {")
			body.Reset()
		case name != "" && l == "}":
			out[name] = body.String()
			name = ""
		case name != "":
			body.WriteString(l + "\n")
		}
	}
	return out
}

// TestKubeProxyIPTablesLoads loads the kube-proxy iptables reference
// into node1 with each flavour's iptables-restore, as the benchmark
// does, then a partial sync's input, and checks the filter table: its
// chains, KUBE-FORWARD's rules and the jumps from the built-in chains
// (new connections only where kube-proxy matches them so).
func TestKubeProxyIPTablesLoads(t *testing.T) {
	svcs := Services(50, 2)
	upd := svcs[5].WithEndpoint(0, ReplacementEndpoint(0))
	after := append([]Service(nil), svcs...)
	after[5] = upd
	for _, flavour := range []string{"legacy", "nft"} {
		t.Run(flavour, func(t *testing.T) {
			restore, list := "iptables-"+flavour+"-restore", "iptables-"+flavour
			testnet.RequireCommand(t, restore)
			tp := testnet.New(t, testnet.Options{Node1Pods: 1})
			for _, in := range []string{KubeProxyIPTables(svcs), KubeProxyIPTablesChange(after, svcs[5], upd)} {
				if out, err := tp.Node1.ExecInput(t.Context(), in, restore, "-w", "5", "--noflush", "--counters"); err != nil {
					t.Fatalf("%s: %v\n%s", restore, err, out)
				}
			}
			out, err := tp.Node1.Exec(t.Context(), list, "-t", "filter", "-S")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"-N KUBE-PROXY-FIREWALL", "-N KUBE-EXTERNAL-SERVICES", "-N KUBE-NODEPORTS", "-N KUBE-SERVICES",
				"-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
				"-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
				"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8",
				"-A INPUT -j KUBE-FIREWALL",
				"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
				"-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("filter table lacks %q:\n%s", want, out)
				}
			}
			if n := strings.Count(out, "-j KUBE-FORWARD"); n != 1 {
				t.Errorf("%d jumps to KUBE-FORWARD after the partial sync, want 1", n)
			}
			nat, err := tp.Node1.Exec(t.Context(), list, "-t", "nat", "-S", "KUBE-SERVICES")
			if err != nil || !strings.Contains(nat, svcs[49].ClusterIP.String()+"/32") {
				t.Errorf("nat KUBE-SERVICES: %v\n%.2000s", err, nat)
			}
		})
	}
}
