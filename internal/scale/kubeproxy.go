package scale

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
)

// This file writes the rule sets kube-proxy would write for a list of
// services, the references the benchmark loads with kube-proxy's own
// tools at the same scale:
//
//   - nftables mode (pkg/proxy/nftables, Kubernetes 1.31+), loaded with
//     `nft -f` as knftables does: one table, a service-ips verdict map
//     dispatching to a chain per service port, whose last rule is an
//     anonymous `numgen random mod N vmap { i : goto endpoint-… }`, and a
//     chain per endpoint doing the DNAT; node ports go through an
//     external-… chain.
//   - iptables mode (pkg/proxy/iptables), loaded with `iptables-restore
//     --noflush --counters`: KUBE-SERVICES matching every cluster IP and
//     jumping to KUBE-SVC-<hash>, which picks a KUBE-SEP-<hash> endpoint
//     chain with `-m statistic --mode random --probability 1/k`; node
//     ports through KUBE-NODEPORTS and KUBE-EXT-<hash>; KUBE-MARK-MASQ and
//     KUBE-POSTROUTING for masquerading.
//
// Health checks, firewall, no-endpoint and cluster-IP reject rules (the
// filter chains) are left out in both: they add sets or a few fixed
// chains, not per-endpoint work, so the figures flatter kube-proxy
// slightly.

// ClusterCIDR is the pod network kube-proxy's rules treat as the
// cluster's (testnet's pod network).
const ClusterCIDR = "10.244.0.0/16"

// NFTTable is the table of the kube-proxy nftables reference.
const NFTTable = "kube-proxy"

// nftName returns kube-proxy's nftables chain name for a service port or
// endpoint: PREFIX-HASH-SUFFIX, HASH eight base32 characters.
func nftName(prefix, suffix string) string {
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

func (s Service) portName() string { return Namespace + "/" + s.Name + ":" + PortName }

func (s Service) nftSuffix() string { return Namespace + "/" + s.Name + "/tcp/" + PortName }

func (s Service) nftServiceChain() string { return nftName("service", s.nftSuffix()) }

func (s Service) nftEndpointChain(ep netip.Addr) string {
	return nftName("endpoint", s.nftSuffix()+"__"+ep.String()+"/"+fmt.Sprint(TargetPort))
}

// nftServiceRules writes the rules of a service port's chain.
func nftServiceRules(w *strings.Builder, s Service) {
	svc := s.nftServiceChain()
	fmt.Fprintf(w, "add rule ip %s %s ip daddr %s tcp dport %d ip saddr != %s jump mark-for-masquerade\n", NFTTable, svc, s.ClusterIP, Port, ClusterCIDR)
	var vm []string
	for i, ep := range s.Endpoints {
		vm = append(vm, fmt.Sprintf("%d : goto %s", i, s.nftEndpointChain(ep)))
	}
	fmt.Fprintf(w, "add rule ip %s %s numgen random mod %d vmap { %s }\n", NFTTable, svc, len(s.Endpoints), strings.Join(vm, " , "))
}

// nftEndpoint writes an endpoint's chain.
func nftEndpoint(w *strings.Builder, s Service, ep netip.Addr) {
	c := s.nftEndpointChain(ep)
	fmt.Fprintf(w, "add chain ip %s %s\n", NFTTable, c)
	fmt.Fprintf(w, "add rule ip %s %s ip saddr %s jump mark-for-masquerade\n", NFTTable, c, ep)
	fmt.Fprintf(w, "add rule ip %s %s meta l4proto tcp dnat to %s:%d\n", NFTTable, c, ep, TargetPort)
}

// KubeProxyNFT returns kube-proxy's nftables rule set for svcs, an `nft
// -f` script.
func KubeProxyNFT(svcs []Service) string {
	var w strings.Builder
	t := NFTTable
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
		for _, ep := range s.Endpoints {
			nftEndpoint(&w, s, ep)
		}
		svc := s.nftServiceChain()
		fmt.Fprintf(&w, "add chain ip %s %s\n", t, svc)
		nftServiceRules(&w, s)
		fmt.Fprintf(&w, "add element ip %s cluster-ips { %s }\n", t, s.ClusterIP)
		fmt.Fprintf(&w, "add element ip %s service-ips { %s . tcp . %d : goto %s }\n", t, s.ClusterIP, Port, svc)
		if s.NodePort != 0 {
			ext := nftName("external", s.nftSuffix())
			fmt.Fprintf(&w, "add chain ip %s %s\n", t, ext)
			fmt.Fprintf(&w, "add rule ip %s %s jump mark-for-masquerade\n", t, ext)
			fmt.Fprintf(&w, "add rule ip %s %s goto %s\n", t, ext, svc)
			fmt.Fprintf(&w, "add element ip %s service-nodeports { tcp . %d : goto %s }\n", t, s.NodePort, ext)
		}
	}
	return w.String()
}

// KubeProxyNFTChange returns the transaction kube-proxy's nftables mode
// sends when the endpoints of a service change from old's to updated's:
// the new endpoints' chains, the service chain flushed and rewritten,
// and the chains of the removed endpoints deleted (kube-proxy deletes
// them a little later, in a later transaction; here at once).
func KubeProxyNFTChange(old, updated Service) string {
	var w strings.Builder
	had := map[netip.Addr]bool{}
	for _, ep := range old.Endpoints {
		had[ep] = true
	}
	has := map[netip.Addr]bool{}
	for _, ep := range updated.Endpoints {
		has[ep] = true
		if !had[ep] {
			nftEndpoint(&w, updated, ep)
		}
	}
	fmt.Fprintf(&w, "flush chain ip %s %s\n", NFTTable, updated.nftServiceChain())
	nftServiceRules(&w, updated)
	for _, ep := range old.Endpoints {
		if !has[ep] {
			fmt.Fprintf(&w, "delete chain ip %s %s\n", NFTTable, old.nftEndpointChain(ep))
		}
	}
	return w.String()
}

// iptHash is kube-proxy's portProtoHash: the first 16 characters of the
// base32 SHA-256 of the name.
func iptHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}

func (s Service) iptSvcChain() string { return "KUBE-SVC-" + iptHash(s.portName()+"tcp") }

func (s Service) iptExtChain() string { return "KUBE-EXT-" + iptHash(s.portName()+"tcp") }

func (s Service) iptSepChain(ep netip.Addr) string {
	return "KUBE-SEP-" + iptHash(s.portName()+"tcp"+fmt.Sprintf("%s:%d", ep, TargetPort))
}

// iptFixedChains are the chains kube-proxy writes on every sync, full or
// partial.
var iptFixedChains = []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"}

func iptFixedRules(w *strings.Builder, svcs []Service) {
	for _, c := range iptFixedChains {
		fmt.Fprintf(w, ":%s - [0:0]\n", c)
	}
	w.WriteString("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n")
	w.WriteString("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n")
	w.WriteString("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n")
	w.WriteString("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n")
	for _, s := range svcs {
		fmt.Fprintf(w, "-A KUBE-SERVICES -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s/32 --dport %d -j %s\n", s.portName(), s.ClusterIP, Port, s.iptSvcChain())
		if s.NodePort != 0 {
			fmt.Fprintf(w, "-A KUBE-NODEPORTS -m comment --comment %s -m tcp -p tcp --dport %d -j %s\n", s.portName(), s.NodePort, s.iptExtChain())
		}
	}
	w.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
}

// iptServiceRules writes the rules of a service port's KUBE-SVC chain
// (and KUBE-EXT chain, with a node port).
func iptServiceRules(w *strings.Builder, s Service) {
	svc := s.iptSvcChain()
	fmt.Fprintf(w, "-A %s -m comment --comment \"%s cluster IP\" -m tcp -p tcp -d %s/32 --dport %d ! -s %s -j KUBE-MARK-MASQ\n", svc, s.portName(), s.ClusterIP, Port, ClusterCIDR)
	n := len(s.Endpoints)
	for i, ep := range s.Endpoints {
		if i < n-1 {
			fmt.Fprintf(w, "-A %s -m comment --comment \"%s -> %s:%d\" -m statistic --mode random --probability %0.10f -j %s\n", svc, s.portName(), ep, TargetPort, 1.0/float64(n-i), s.iptSepChain(ep))
		} else {
			fmt.Fprintf(w, "-A %s -m comment --comment \"%s -> %s:%d\" -j %s\n", svc, s.portName(), ep, TargetPort, s.iptSepChain(ep))
		}
	}
	if s.NodePort != 0 {
		ext := s.iptExtChain()
		fmt.Fprintf(w, "-A %s -m comment --comment \"masquerade traffic for %s external destinations\" -j KUBE-MARK-MASQ\n", ext, s.portName())
		fmt.Fprintf(w, "-A %s -j %s\n", ext, svc)
	}
}

func iptEndpointRules(w *strings.Builder, s Service, ep netip.Addr) {
	sep := s.iptSepChain(ep)
	fmt.Fprintf(w, "-A %s -m comment --comment %s -s %s/32 -j KUBE-MARK-MASQ\n", sep, s.portName(), ep)
	fmt.Fprintf(w, "-A %s -m comment --comment %s -m tcp -p tcp -j DNAT --to-destination %s:%d\n", sep, s.portName(), ep, TargetPort)
}

// KubeProxyIPTables returns the nat table kube-proxy's iptables mode
// writes for svcs on its first sync, an `iptables-restore --noflush`
// input, with the jumps from the built-in chains (which kube-proxy adds
// with `iptables -I` before) appended.
func KubeProxyIPTables(svcs []Service) string {
	var w strings.Builder
	w.WriteString("*nat\n")
	for _, s := range svcs {
		fmt.Fprintf(&w, ":%s - [0:0]\n", s.iptSvcChain())
		if s.NodePort != 0 {
			fmt.Fprintf(&w, ":%s - [0:0]\n", s.iptExtChain())
		}
		for _, ep := range s.Endpoints {
			fmt.Fprintf(&w, ":%s - [0:0]\n", s.iptSepChain(ep))
		}
	}
	iptFixedRules(&w, svcs)
	for _, s := range svcs {
		iptServiceRules(&w, s)
		for _, ep := range s.Endpoints {
			iptEndpointRules(&w, s, ep)
		}
	}
	w.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	w.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	w.WriteString("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n")
	w.WriteString("COMMIT\n")
	return w.String()
}

// KubeProxyIPTablesChange returns the partial restore kube-proxy's
// iptables mode (MinimizeIPTablesRestore, the default since 1.27) writes
// when the endpoints of svcs[idx] change to updated's: the fixed chains
// are rewritten in full (KUBE-SERVICES with every service's rule), the
// changed service's chains are rewritten, new endpoint chains are
// created and removed ones flushed and deleted. svcs is the state after
// the change (svcs[idx] == updated), old the service before it.
func KubeProxyIPTablesChange(svcs []Service, old, updated Service) string {
	var w strings.Builder
	w.WriteString("*nat\n")
	had := map[netip.Addr]bool{}
	for _, ep := range old.Endpoints {
		had[ep] = true
	}
	has := map[netip.Addr]bool{}
	for _, ep := range updated.Endpoints {
		has[ep] = true
	}
	fmt.Fprintf(&w, ":%s - [0:0]\n", updated.iptSvcChain())
	if updated.NodePort != 0 {
		fmt.Fprintf(&w, ":%s - [0:0]\n", updated.iptExtChain())
	}
	for _, ep := range updated.Endpoints {
		if !had[ep] {
			fmt.Fprintf(&w, ":%s - [0:0]\n", updated.iptSepChain(ep))
		}
	}
	var gone []string
	for _, ep := range old.Endpoints {
		if !has[ep] {
			c := old.iptSepChain(ep)
			gone = append(gone, c)
			fmt.Fprintf(&w, ":%s - [0:0]\n", c)
		}
	}
	iptFixedRules(&w, svcs)
	iptServiceRules(&w, updated)
	for _, ep := range updated.Endpoints {
		if !had[ep] {
			iptEndpointRules(&w, updated, ep)
		}
	}
	for _, c := range gone {
		fmt.Fprintf(&w, "-X %s\n", c)
	}
	w.WriteString("COMMIT\n")
	return w.String()
}

// Chains returns roughly how many chains kube-proxy's layouts hold for n
// services of eps endpoints: the size the references' costs grow with.
func Chains(n, eps int) int { return n * (eps + 1) }
