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
//   - nftables mode (pkg/proxy/nftables), loaded with `nft -f` as
//     knftables does: one table, a service-ips verdict map dispatching to
//     a chain per service port, whose last rule is an anonymous `numgen
//     random mod N vmap { i : goto endpoint-… }`, and a chain per
//     endpoint doing the DNAT; node ports go through an external-… chain.
//     The filter side is kube-proxy 1.36's (see [KubeProxyNFT]): five
//     filter base chains whose `ct state new` rules jump to
//     firewall-check, service-endpoints-check, nodeport-endpoints-check
//     and cluster-ips-check, which look up the firewall-ips,
//     no-endpoint-services and no-endpoint-nodeports maps (empty here:
//     every service has endpoints and none is a load balancer), reject
//     what goes to @cluster-ips and drop what goes to [ServiceCIDR].
//   - iptables mode (pkg/proxy/iptables), loaded with `iptables-restore
//     --noflush --counters`: in the nat table KUBE-SERVICES matching
//     every cluster IP and jumping to KUBE-SVC-<hash>, which picks a
//     KUBE-SEP-<hash> endpoint chain with `-m statistic --mode random
//     --probability 1/k`; node ports through KUBE-NODEPORTS and
//     KUBE-EXT-<hash>; KUBE-MARK-MASQ and KUBE-POSTROUTING for
//     masquerading. In the filter table, as kube-proxy 1.36 writes it
//     (see [KubeProxyIPTables]), KUBE-FORWARD, KUBE-FIREWALL and the
//     chains that hold rules only for services without endpoints, load
//     balancer source ranges or health check node ports (empty here).
//
// Differences from kube-proxy 1.36 that remain: the nftables NAT side is
// the layout of 1.31-1.33 (1.36 writes endpoint chains only for
// services with session affinity, DNATs from the service chain with a
// `numgen random mod N map`, marks for masquerading in the services
// chain, and has a hairpin-connections set); node ports are accepted on
// every local address (`fib daddr type local`, kube-proxy's behaviour
// with `--nodeport-addresses` set to all addresses; the nftables mode's
// default, "primary", looks node1's address up in a nodeport-ips set
// instead); the iptables layout has no nfacct counters (kube-proxy adds
// `-m nfacct` to its INVALID drop rule and writes localhost node port
// rules when the kernel's nfacct is there). Rules that only services
// without endpoints, load balancers with source ranges or health check
// node ports get are absent because the benchmark has none.

// ClusterCIDR is the pod network kube-proxy's rules treat as the
// cluster's (testnet's pod network).
const ClusterCIDR = "10.244.0.0/16"

// ServiceCIDR is the service range of the references' cluster, which
// kube-proxy 1.36 learns from the cluster's ServiceCIDR objects (the
// MultiCIDRServiceAllocator feature, locked on since 1.34) and drops
// traffic to when no service took the address: kubeadm's default range,
// which holds every generated cluster IP and [TargetIP].
const ServiceCIDR = "10.96.0.0/12"

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

// nftFilter writes the filter side of kube-proxy 1.36's nftables table:
// the maps its check chains look up, the check chains, the base chains
// and their jumps, in the order of kube-proxy's jump list (so
// service-endpoints-check runs before cluster-ips-check in
// filter-forward and filter-output). Chain priorities are numbers, as
// knftables writes them: dstnat-10 (-110) for the pre-DNAT chains,
// filter (0) for the others.
// The cluster-ips set it reads is declared by the caller.
func nftFilter(w *strings.Builder) {
	t := NFTTable
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("add map ip %s no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }", t)
	p("add map ip %s no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }", t)
	p("add map ip %s firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }", t)
	for _, c := range nftCheckChains {
		p("add chain ip %s %s", t, c)
	}
	p("add chain ip %s reject-chain { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }", t)
	p("add rule ip %s reject-chain reject", t)
	p("add rule ip %s cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"", t)
	p("add rule ip %s cluster-ips-check ip daddr { %s } drop comment \"Drop traffic to unallocated ClusterIPs\"", t, ServiceCIDR)
	p("add rule ip %s service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services", t)
	p("add rule ip %s nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports", t)
	p("add rule ip %s firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips", t)
	for _, bc := range nftFilterChains {
		p("add chain ip %s %s { type filter hook %s priority %s ; }", t, bc.name, bc.hook, bc.priority)
	}
	for _, j := range []struct{ to, from string }{
		{"nodeport-endpoints-check", "filter-input"},
		{"service-endpoints-check", "filter-input"},
		{"service-endpoints-check", "filter-forward"},
		{"service-endpoints-check", "filter-output"},
		{"firewall-check", "filter-prerouting-pre-dnat"},
		{"firewall-check", "filter-output-pre-dnat"},
		{"cluster-ips-check", "filter-forward"},
		{"cluster-ips-check", "filter-output"},
	} {
		p("add rule ip %s %s ct state new jump %s", t, j.from, j.to)
	}
}

// nftBaseChain is a base chain of the kube-proxy nftables reference: its
// name, netfilter hook and numeric priority.
type nftBaseChain struct{ name, hook, priority string }

// nftFilterChains are the filter base chains of kube-proxy 1.36's
// nftables table.
var nftFilterChains = []nftBaseChain{
	{"filter-prerouting-pre-dnat", "prerouting", "-110"},
	{"filter-output-pre-dnat", "output", "-110"},
	{"filter-input", "input", "0"},
	{"filter-forward", "forward", "0"},
	{"filter-output", "output", "0"},
}

// nftCheckChains are the regular chains the filter base chains jump to.
var nftCheckChains = []string{"nodeport-endpoints-check", "service-endpoints-check", "firewall-check", "cluster-ips-check"}

// KubeProxyNFT returns kube-proxy's nftables rule set for svcs, an `nft
// -f` script: the NAT side described in this file's comment, and the
// filter side of kube-proxy 1.36, whose base chains run on every packet
// of a new connection (in a one-way UDP flood, every datagram); the
// cluster-ips set holds every cluster IP, the no-endpoint and firewall
// maps stay empty.
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
	nftFilter(&w)
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

// iptFilter writes the filter table kube-proxy 1.36's iptables mode
// writes on every sync, full or partial, for services that all have
// endpoints, no load balancer and no health check node port: its
// chains, KUBE-FIREWALL's localnet rule (written with the default
// localhostNodePorts), KUBE-FORWARD's rules (the INVALID drop is written
// while nf_conntrack_tcp_be_liberal is 0, the default), and, with jumps,
// the jumps from the built-in chains, which kube-proxy adds before its
// first restore with `iptables -I` (each put first, so they end up in
// the reverse of the order it adds them).
func iptFilter(w *strings.Builder, jumps bool) {
	w.WriteString("*filter\n")
	for _, c := range []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-FIREWALL"} {
		fmt.Fprintf(w, ":%s - [0:0]\n", c)
	}
	w.WriteString("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n")
	w.WriteString("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n")
	w.WriteString("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n")
	w.WriteString("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n")
	if jumps {
		const newConn = "-m conntrack --ctstate NEW "
		for _, j := range []struct{ from, match, comment, to string }{
			{"INPUT", "", "", "KUBE-FIREWALL"},
			{"INPUT", newConn, "kubernetes load balancer firewall", "KUBE-PROXY-FIREWALL"},
			{"INPUT", "", "kubernetes health check service ports", "KUBE-NODEPORTS"},
			{"INPUT", newConn, "kubernetes externally-visible service portals", "KUBE-EXTERNAL-SERVICES"},
			{"FORWARD", newConn, "kubernetes load balancer firewall", "KUBE-PROXY-FIREWALL"},
			{"FORWARD", "", "kubernetes forwarding rules", "KUBE-FORWARD"},
			{"FORWARD", newConn, "kubernetes service portals", "KUBE-SERVICES"},
			{"FORWARD", newConn, "kubernetes externally-visible service portals", "KUBE-EXTERNAL-SERVICES"},
			{"OUTPUT", "", "", "KUBE-FIREWALL"},
			{"OUTPUT", newConn, "kubernetes load balancer firewall", "KUBE-PROXY-FIREWALL"},
			{"OUTPUT", newConn, "kubernetes service portals", "KUBE-SERVICES"},
		} {
			c := ""
			if j.comment != "" {
				c = fmt.Sprintf("-m comment --comment \"%s\" ", j.comment)
			}
			fmt.Fprintf(w, "-A %s %s%s-j %s\n", j.from, j.match, c, j.to)
		}
	}
	w.WriteString("COMMIT\n")
}

// KubeProxyIPTables returns the filter and nat tables kube-proxy's
// iptables mode writes for svcs on its first sync, an `iptables-restore
// --noflush` input, with the jumps from the built-in chains (which
// kube-proxy adds with `iptables -I` before) appended to each table's
// rules. The filter table is the same for any services that all have
// endpoints (see iptFilter).
func KubeProxyIPTables(svcs []Service) string {
	var w strings.Builder
	iptFilter(&w, true)
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
// created and removed ones flushed and deleted; the filter table is
// rewritten whole, as on every sync. svcs is the state after the change
// (svcs[idx] == updated), old the service before it.
func KubeProxyIPTablesChange(svcs []Service, old, updated Service) string {
	var w strings.Builder
	iptFilter(&w, false)
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
