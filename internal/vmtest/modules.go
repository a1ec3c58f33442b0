package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// BootModules are loaded first, in this order: the virtio transport, the
// 9p file system that carries the test binaries and results, and the
// virtio random number generator (so that getrandom never blocks).
var BootModules = []string{
	"virtio_pci", "virtio_rng", "9pnet_virtio", "9p",
}

// DefaultModules are loaded before the tests run: everything the
// backends and the test harness use. Modules that are built into the
// kernel, or missing from it, are reported on the console and skipped.
// Other netfilter modules are in the image too and load on demand.
var DefaultModules = []string{
	// a soft dependency of libcrc32c (nf_conntrack, nf_tables, ip_vs)
	"crc32c_generic",
	// links
	"dummy", "veth",
	// tc: the clsact qdisc and the bpf classifier (the eBPF backend's
	// NorthSouth tc where the kernel has no tcx, as Debian's 6.1)
	"sch_ingress", "cls_bpf",
	// connection tracking and NAT
	"nf_conntrack", "nf_conntrack_netlink", "nf_nat", "nf_defrag_ipv4", "nf_defrag_ipv6",
	// IPVS and its schedulers
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_lblc", "ip_vs_lblcr",
	"ip_vs_dh", "ip_vs_sh", "ip_vs_sed", "ip_vs_nq", "ip_vs_mh", "ip_vs_fo", "ip_vs_ovf",
	// nf_tables
	"nf_tables", "nft_chain_nat", "nft_nat", "nft_masq", "nft_redir", "nft_ct", "nft_fib",
	"nft_fib_ipv4", "nft_fib_ipv6", "nft_fib_inet", "nft_reject", "nft_reject_ipv4",
	"nft_reject_ipv6", "nft_reject_inet", "nft_numgen", "nft_hash", "nft_limit", "nft_compat",
	"nft_objref", "nft_quota", "nft_log",
	// iptables (legacy and nft) and the matches kube-proxy-like rules use
	"x_tables", "ip_tables", "iptable_filter", "iptable_nat", "iptable_mangle", "iptable_raw",
	"ip6_tables", "ip6table_filter", "ip6table_nat", "ip6table_mangle", "ip6table_raw",
	"ipt_REJECT", "ip6t_REJECT", "xt_MASQUERADE", "xt_mark", "xt_comment",
	"xt_conntrack", "xt_addrtype", "xt_multiport", "xt_set", "xt_statistic", "xt_recent",
	"xt_nat", "xt_tcpudp", "xt_sctp", "xt_NFLOG", "xt_LOG", "xt_CT", "xt_connmark", "xt_state",
	// ipset
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip",
	"ip_set_hash_ipportnet", "ip_set_hash_net", "ip_set_hash_netport", "ip_set_bitmap_port",
	// netlink handles that ask for XFRM (netlink.NewHandle's default)
	"xfrm_user",
}

// autoloadDirs are module directories packed whole, so that the kernel
// can load any of them on demand (nft expressions, xt matches, ipset
// types, IPVS schedulers).
var autoloadDirs = []string{
	"kernel/net/netfilter/",
	"kernel/net/ipv4/netfilter/",
	"kernel/net/ipv6/netfilter/",
}

// moduleIndex is a parsed modules.dep: module name -> path and deps.
type moduleIndex struct {
	path map[string]string   // name -> path relative to the module dir
	deps map[string][]string // path -> dependency paths
}

// moduleName returns the module name of a path: kernel/net/x/nf_nat.ko ->
// nf_nat. Dashes and underscores are the same to the kernel; names use
// underscores.
func moduleName(p string) string {
	base := path.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

func parseModulesDep(r io.Reader) (*moduleIndex, error) {
	idx := &moduleIndex{path: map[string]string{}, deps: map[string][]string{}}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, deps, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep: bad line %q", line)
		}
		mod = strings.TrimSpace(mod)
		idx.path[moduleName(mod)] = mod
		idx.deps[mod] = strings.Fields(deps)
	}
	return idx, s.Err()
}

func loadModuleIndex(modDir string) (*moduleIndex, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseModulesDep(f)
}

// closure returns the paths of the named modules and of everything they
// depend on, sorted, and the names the index does not know.
func (idx *moduleIndex) closure(names []string, dirs []string) (paths, unknown []string) {
	seen := map[string]bool{}
	var visit func(p string)
	visit = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		for _, d := range idx.deps[p] {
			visit(d)
		}
	}
	for _, n := range names {
		p, ok := idx.path[strings.ReplaceAll(n, "-", "_")]
		if !ok {
			unknown = append(unknown, n)
			continue
		}
		visit(p)
	}
	for p := range idx.deps {
		for _, d := range dirs {
			if strings.HasPrefix(p, d) {
				visit(p)
			}
		}
	}
	for p := range seen {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths, unknown
}
