package nftables

import (
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// This file generates the ruleset kube-proxy's nftables mode would write
// for the services of backendtest.ScaleServices, so that benchmarks can
// load it with `nft -f` next to this backend's figures. It follows
// kube-proxy's layout (pkg/proxy/nftables, Kubernetes 1.31+): one table,
// a service-ips verdict map dispatching to a chain per service port,
// whose last rule is an anonymous `numgen random mod N vmap { i : goto
// endpoint-… }`, and a chain per endpoint doing the DNAT; node ports go
// through an external-… chain. Health checks, firewall, no-endpoint and
// cluster-IP reject rules are left out (they add sets, not per-service
// work), so the figures flatter kube-proxy's layout slightly. The
// commands are what knftables sends: add table/chain/rule/element.

const kpTable = "kube-proxy"

// kpName returns kube-proxy's chain name for a service port or endpoint:
// PREFIX-HASH-SUFFIX, HASH eight base32 characters.
func kpName(prefix, suffix string) string {
	h := fnv.New64a()
	h.Write([]byte(suffix))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	v := h.Sum64()
	var b [8]byte
	for i := range b {
		b[i] = alphabet[v&31]
		v >>= 5
	}
	return prefix + "-" + string(b[:]) + "-" + suffix
}

func kpSvcSuffix(s testSvc) string {
	return "ns/" + s.Port.Name.Name + "/tcp/" + s.Port.Name.Port
}

func kpEndpointChain(s testSvc, ep string) string {
	return kpName("endpoint", kpSvcSuffix(s)+"__"+strings.Replace(ep, ":", "/", 1))
}

// kpServiceRules writes the rules of a service port's chain.
func kpServiceRules(w *strings.Builder, s testSvc, eps []string) {
	svc := kpName("service", kpSvcSuffix(s))
	fmt.Fprintf(w, "add rule ip %s %s ip daddr %s tcp dport %d ip saddr != 10.0.0.0/8 jump mark-for-masquerade\n", kpTable, svc, s.Port.ClusterIP, s.Port.Port)
	var vm []string
	for i, ep := range eps {
		vm = append(vm, fmt.Sprintf("%d : goto %s", i, kpEndpointChain(s, ep)))
	}
	fmt.Fprintf(w, "add rule ip %s %s numgen random mod %d vmap { %s }\n", kpTable, svc, len(eps), strings.Join(vm, " , "))
}

// kpEndpoint writes an endpoint's chain.
func kpEndpoint(w *strings.Builder, s testSvc, ep string) {
	c := kpEndpointChain(s, ep)
	ip, _, _ := strings.Cut(ep, ":")
	fmt.Fprintf(w, "add chain ip %s %s\n", kpTable, c)
	fmt.Fprintf(w, "add rule ip %s %s ip saddr %s jump mark-for-masquerade\n", kpTable, c, ip)
	fmt.Fprintf(w, "add rule ip %s %s meta l4proto tcp dnat to %s\n", kpTable, c, ep)
}

func kpEndpoints(s testSvc) []string {
	var out []string
	for _, e := range s.Targets.Internal {
		out = append(out, e.Addr.String())
	}
	return out
}

// kubeProxyRuleset returns kube-proxy's full ruleset for svcs.
func kubeProxyRuleset(svcs []testSvc) string {
	var w strings.Builder
	t := kpTable
	fmt.Fprintf(&w, "add table ip %s { comment \"rules for kube-proxy\" ; }\n", t)
	fmt.Fprintf(&w, "add set ip %s cluster-ips { type ipv4_addr ; comment \"Active ClusterIPs\" ; }\n", t)
	fmt.Fprintf(&w, "add map ip %s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }\n", t)
	fmt.Fprintf(&w, "add map ip %s service-nodeports { type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }\n", t)
	for _, c := range []string{"mark-for-masquerade", "masquerading", "services"} {
		fmt.Fprintf(&w, "add chain ip %s %s\n", t, c)
	}
	fmt.Fprintf(&w, "add rule ip %s mark-for-masquerade mark set mark or 0x4000\n", t)
	fmt.Fprintf(&w, "add rule ip %s masquerading mark and 0x4000 == 0 return\n", t)
	fmt.Fprintf(&w, "add rule ip %s masquerading mark set mark xor 0x4000\n", t)
	fmt.Fprintf(&w, "add rule ip %s masquerading masquerade fully-random\n", t)
	fmt.Fprintf(&w, "add rule ip %s services ip daddr . meta l4proto . th dport vmap @service-ips\n", t)
	fmt.Fprintf(&w, "add rule ip %s services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n", t)
	fmt.Fprintf(&w, "add chain ip %s nat-prerouting { type nat hook prerouting priority -100 ; }\n", t)
	fmt.Fprintf(&w, "add rule ip %s nat-prerouting jump services\n", t)
	fmt.Fprintf(&w, "add chain ip %s nat-output { type nat hook output priority -100 ; }\n", t)
	fmt.Fprintf(&w, "add rule ip %s nat-output jump services\n", t)
	fmt.Fprintf(&w, "add chain ip %s nat-postrouting { type nat hook postrouting priority 100 ; }\n", t)
	fmt.Fprintf(&w, "add rule ip %s nat-postrouting jump masquerading\n", t)
	for _, s := range svcs {
		eps := kpEndpoints(s)
		for _, ep := range eps {
			kpEndpoint(&w, s, ep)
		}
		svc := kpName("service", kpSvcSuffix(s))
		fmt.Fprintf(&w, "add chain ip %s %s\n", t, svc)
		kpServiceRules(&w, s, eps)
		fmt.Fprintf(&w, "add element ip %s cluster-ips { %s }\n", t, s.Port.ClusterIP)
		fmt.Fprintf(&w, "add element ip %s service-ips { %s . tcp . %d : goto %s }\n", t, s.Port.ClusterIP, s.Port.Port, svc)
		if s.Port.NodePort != 0 {
			ext := kpName("external", kpSvcSuffix(s))
			fmt.Fprintf(&w, "add chain ip %s %s\n", t, ext)
			fmt.Fprintf(&w, "add rule ip %s %s jump mark-for-masquerade\n", t, ext)
			fmt.Fprintf(&w, "add rule ip %s %s goto %s\n", t, ext, svc)
			fmt.Fprintf(&w, "add element ip %s service-nodeports { tcp . %d : goto %s }\n", t, s.Port.NodePort, ext)
		}
	}
	return w.String()
}

// kubeProxyAddEndpoint returns the transaction kube-proxy sends when ep is
// added to s (whose endpoints were eps): the new endpoint's chain, and the
// service chain rewritten with the new modulus. kube-proxy also rewrites
// the chains of the service's other endpoints; that is left out.
func kubeProxyAddEndpoint(s testSvc, eps []string, ep string) string {
	var w strings.Builder
	kpEndpoint(&w, s, ep)
	svc := kpName("service", kpSvcSuffix(s))
	fmt.Fprintf(&w, "flush chain ip %s %s\n", kpTable, svc)
	kpServiceRules(&w, s, append(append([]string{}, eps...), ep))
	return w.String()
}

// kubeProxyRemoveEndpoint undoes kubeProxyAddEndpoint.
func kubeProxyRemoveEndpoint(s testSvc, eps []string, ep string) string {
	var w strings.Builder
	svc := kpName("service", kpSvcSuffix(s))
	fmt.Fprintf(&w, "flush chain ip %s %s\n", kpTable, svc)
	kpServiceRules(&w, s, eps)
	fmt.Fprintf(&w, "delete chain ip %s %s\n", kpTable, kpEndpointChain(s, ep))
	return w.String()
}

// nftFile runs `nft -f` on script in ns and returns how long it took.
func nftFile(tb testing.TB, ns *testNS, script string) time.Duration {
	tb.Helper()
	f := filepath.Join(tb.TempDir(), "ruleset.nft")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command("ip", "netns", "exec", ns.name, "nft", "-f", f).CombinedOutput()
	d := time.Since(start)
	if err != nil {
		tb.Fatalf("nft -f: %v\n%.2000s", err, out)
	}
	return d
}
