// Package nodesetup makes the node settings that kube-proxy (v1.36)
// makes before it programs anything: the conntrack sysctls of its
// conntrack section, then the sysctls of its proxy mode. [Apply] makes
// them in a network namespace (the caller's own, or Config.NetNS) and
// returns and logs each change; [Plan] returns what Apply would change
// and changes nothing, for --dry-run and --init-only reports.
//
// Every setting is read first and written only when it differs, so a
// second Apply changes nothing. A zero field leaves its setting alone, as
// in kube-proxy. The order is kube-proxy's: conntrack (its platformSetup,
// K/pkg/proxy/conntrack/sysctls.go) before the mode's sysctls (its
// proxier constructor). Apply stops at the first setting it cannot make
// with a [*SettingError] that names it and says why; kube-proxy fails on
// every one of these too (its only warnings here are the IPVS timeouts,
// which are no sysctls and which the ipvs backend sets, and
// conn_reuse_mode on a kernel older than 4.1, which we log at Error as
// kube-proxy does and skip).
//
// # Settings
//
// Setting → sysctl (below /proc/sys) or file → kube-proxy's rule → ours,
// in the order Apply makes them:
//
//	conntrack.maxPerCore, conntrack.min
//	  net/netfilter/nf_conntrack_max
//	  kube-proxy: maxPerCore × CPUs, at least min; a product above 1048576
//	    gives 1048576 (even if min is larger); written whenever it differs,
//	    so also lowered; maxPerCore 0 leaves it (and min) alone
//	  ours: the same (ConntrackMax); outside the initial namespace see
//	    below
//	(with nf_conntrack_max)
//	  /sys/module/nf_conntrack/parameters/hashsize (HashsizePath)
//	  kube-proxy: raised to max/4 when lower, never lowered; a read or write
//	    error (read-only /sys) is fatal
//	  ours: the same in the initial namespace; outside it see below
//	conntrack.tcpEstablishedTimeout, conntrack.tcpCloseWaitTimeout
//	  net/netfilter/nf_conntrack_tcp_timeout_established, _close_wait
//	  kube-proxy: whole seconds (truncated) when > 0
//	  ours: the same, per namespace
//	conntrack.tcpBeLiberal
//	  net/netfilter/nf_conntrack_tcp_be_liberal
//	  kube-proxy: 1 when true; false never writes 0
//	  ours: the same, per namespace
//	conntrack.udpTimeout, conntrack.udpStreamTimeout
//	  net/netfilter/nf_conntrack_udp_timeout, _udp_timeout_stream
//	  kube-proxy: whole seconds (truncated) when > 0
//	  ours: the same, per namespace
//	iptables mode: iptables.localhostNodePorts, nodePortAddresses
//	  net/ipv4/conf/all/route_localnet
//	  kube-proxy: 1 when localhostNodePorts and the IPv4 nodePortAddresses
//	    include 127.0.0.0/8 (no IPv4 CIDR: every address does); IPv4
//	    proxier only
//	  ours: the same (Config.LocalhostNodePorts: pass false without IPv4;
//	    Config.NodePortAddresses with "primary" expanded)
//	ipvs mode
//	  net/ipv4/vs/conntrack
//	  kube-proxy: 1.  ours: the same
//	  net/ipv4/vs/conn_reuse_mode
//	  kube-proxy: 0 on kernels 4.1 to 5.8, left alone from 5.9, an error
//	    logged (and nothing set) before 4.1.  ours: the same
//	  net/ipv4/vs/expire_nodest_conn, net/ipv4/vs/expire_quiescent_template,
//	  net/ipv4/ip_forward
//	  kube-proxy: 1 each.  ours: the same
//	ipvs mode: ipvs.strictARP
//	  net/ipv4/conf/all/arp_ignore, net/ipv4/conf/all/arp_announce
//	  kube-proxy: 1 and 2 when true.  ours: the same
//	nftables mode
//	  kube-proxy: nothing.  ours: nothing
//	ebpf mode (ours only)
//	  nothing: its north-south rules are an nftables backend's table, and
//	  its socket programs need no sysctl
//
// The CPU count is that of /sys/devices/system/cpu/online (kube-proxy
// reads cadvisor's topology of /sys), else runtime.NumCPU; Config.NumCPU
// overrides it. An empty Config.Mode is "iptables", kube-proxy's default.
//
// # Host-global settings and namespaces
//
// nf_conntrack_max and the hash size belong to the host. kube-proxy runs
// in the host's namespace and sets them there. Outside the initial
// namespace (that of PID 1), e.g. a CNI agent that runs a proxier for a
// pod namespace, the kernel makes nf_conntrack_max read-only (it shows
// the host's value) and /sys/module is the host's. kube-proxy's logic
// would fail writing nf_conntrack_max there (EACCES) when it differs,
// and would otherwise change the host's hash size from inside the
// namespace. We never write either outside the initial namespace: a
// value that already satisfies the configuration is accepted, anything
// else fails with an error matching [ErrHostGlobal] that says so. Set
// them from the host's namespace, or set Conntrack.MaxPerCore to 0
// (conntrack.maxPerCore: 0, as kind does) to leave them alone. The
// timeouts and be_liberal are per namespace and set there. A kernel
// that lets a namespace write nf_conntrack_max keeps it per namespace,
// and Apply writes it.
//
// kube-proxy 1.36 has no special case for a read-only /sys: a hash size
// it cannot raise is fatal. So is it here (a [*SettingError] matching
// syscall.EROFS, with a hint).
//
// # Differences from kube-proxy's logs
//
// Apply logs one Info record "Changed node setting" per change with key,
// old and new (kube-proxy logs conntrack writes at Info and the mode's
// sysctls at V(1)), and kube-proxy's Info line about route_localnet.
// Plan logs each change it would make at Debug.
package nodesetup
