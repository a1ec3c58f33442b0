package nodesetup

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"time"
)

// Conntrack is kube-proxy's conntrack section (KubeProxyConntrackConfiguration);
// a zero field leaves that setting alone, as in kube-proxy.
type Conntrack struct {
	// MaxPerCore and Min give nf_conntrack_max: MaxPerCore × the number
	// of CPUs, at least Min, and at most 1048576 when the product
	// exceeds it (see [ConntrackMax]). MaxPerCore 0 leaves
	// nf_conntrack_max and the hash size alone and ignores Min.
	MaxPerCore, Min int32
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set
	// nf_conntrack_tcp_timeout_established and
	// nf_conntrack_tcp_timeout_close_wait, in whole seconds.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	// UDPTimeout and UDPStreamTimeout set nf_conntrack_udp_timeout and
	// nf_conntrack_udp_timeout_stream, in whole seconds.
	UDPTimeout, UDPStreamTimeout time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1; false never
	// writes 0.
	TCPBeLiberal bool
}

// Config says what to set up, in which namespace.
type Config struct {
	// NetNS is the path of the network namespace (e.g.
	// /var/run/netns/x or /proc/PID/ns/net); empty: the caller's own.
	NetNS string
	// Conntrack is kube-proxy's conntrack section.
	Conntrack Conntrack
	// Mode is "nftables", "iptables", "ipvs" or "ebpf" and selects the
	// mode's own sysctls, as kube-proxy's proxier of that mode sets
	// them. Empty means "iptables", kube-proxy's default on Linux.
	Mode string
	// IPVSStrictARP (ipvs mode) sets arp_ignore=1 and arp_announce=2 on
	// all interfaces, as kube-proxy's ipvs.strictARP.
	IPVSStrictARP bool
	// LocalhostNodePorts (iptables mode) is kube-proxy's
	// iptables.localhostNodePorts: it sets route_localnet=1 when
	// NodePortAddresses lets node ports open on 127.0.0.0/8. kube-proxy
	// does this in its IPv4 proxier only: pass false on a node without
	// IPv4.
	LocalhostNodePorts bool
	// NodePortAddresses is kube-proxy's nodePortAddresses with
	// "primary" already expanded to the node's IPs: CIDRs of either
	// family. With no IPv4 CIDR, IPv4 node ports open on every local
	// address, loopback included.
	NodePortAddresses []string
	// NumCPU is the CPU count for nf_conntrack_max; 0 counts the online
	// CPUs in /sys/devices/system/cpu/online, falling back to
	// runtime.NumCPU, as kube-proxy (cadvisor's topology, then
	// runtime.NumCPU).
	NumCPU int
	// Logger receives one Info record per change; nil discards.
	Logger *slog.Logger
}

// Change is one setting changed (or that would be). Key is a path below
// /proc/sys for a sysctl (e.g. "net/netfilter/nf_conntrack_max"), or an
// absolute path for another file (the conntrack hash size,
// [HashsizePath]). Old is the value read before ("" when it could not be
// read); New the value written.
type Change struct{ Key, Old, New string }

// String returns "key: old -> new".
func (c Change) String() string { return c.Key + ": " + c.Old + " -> " + c.New }

// HashsizePath is the module parameter that sizes the conntrack hash
// table; kube-proxy raises it to nf_conntrack_max/4. It is host-global.
const HashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"

// Sysctl keys (paths below /proc/sys) that Apply may set.
const (
	KeyConntrackMax                = "net/netfilter/nf_conntrack_max"
	KeyTCPEstablishedTimeout       = "net/netfilter/nf_conntrack_tcp_timeout_established"
	KeyTCPCloseWaitTimeout         = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	KeyTCPBeLiberal                = "net/netfilter/nf_conntrack_tcp_be_liberal"
	KeyUDPTimeout                  = "net/netfilter/nf_conntrack_udp_timeout"
	KeyUDPStreamTimeout            = "net/netfilter/nf_conntrack_udp_timeout_stream"
	KeyRouteLocalnet               = "net/ipv4/conf/all/route_localnet"
	KeyIPVSConntrack               = "net/ipv4/vs/conntrack"
	KeyIPVSConnReuseMode           = "net/ipv4/vs/conn_reuse_mode"
	KeyIPVSExpireNoDestConn        = "net/ipv4/vs/expire_nodest_conn"
	KeyIPVSExpireQuiescentTemplate = "net/ipv4/vs/expire_quiescent_template"
	KeyIPForward                   = "net/ipv4/ip_forward"
	KeyARPIgnore                   = "net/ipv4/conf/all/arp_ignore"
	KeyARPAnnounce                 = "net/ipv4/conf/all/arp_announce"
)

// ConntrackMaxLimit is kube-proxy's cap on MaxPerCore × CPUs.
const ConntrackMaxLimit = 1048576

// ErrHostGlobal is matched (errors.Is) by the error of a setting that is
// host-global and that Apply does not make from a network namespace other
// than the initial one: nf_conntrack_max where the kernel makes it
// read-only there, and the conntrack hash size.
var ErrHostGlobal = errors.New("host-global setting, not changed from a non-initial network namespace")

// ErrNotSupported is matched by the error of Apply and Plan on systems
// other than Linux.
var ErrNotSupported = errors.New("node setup needs Linux")

// SettingError is the error of a setting Apply could not make (or that
// Plan knows Apply could not make). It names the setting, the value and
// the namespace; Err says why and may match [ErrHostGlobal],
// syscall.EROFS (a read-only /sys), fs.ErrPermission or fs.ErrNotExist.
type SettingError struct {
	Key   string // as in [Change]
	Value string // the value that could not be set ("" if reading failed)
	NetNS string // the namespace path; "" for the caller's own
	Err   error
}

func (e *SettingError) Error() string {
	var b strings.Builder
	b.WriteString("nodesetup: ")
	if e.Value != "" {
		fmt.Fprintf(&b, "can't set %s to %s", e.Key, e.Value)
	} else {
		fmt.Fprintf(&b, "can't read %s", e.Key)
	}
	if e.NetNS != "" {
		fmt.Fprintf(&b, " in network namespace %s", e.NetNS)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if h := e.hint(); h != "" {
		b.WriteString(" (" + h + ")")
	}
	return b.String()
}

// hint says what the operator can do about the common failures.
func (e *SettingError) hint() string {
	conntrackMax := e.Key == KeyConntrackMax || e.Key == HashsizePath
	switch {
	case errors.Is(e.Err, ErrHostGlobal) && conntrackMax:
		return "set it from the host's namespace, or set conntrack.maxPerCore to 0 to leave it alone"
	case errors.Is(e.Err, syscall.EROFS) && e.Key == HashsizePath:
		return "/sys is read-only: run privileged, or set conntrack.maxPerCore to 0 to leave it alone"
	case errors.Is(e.Err, syscall.ENOENT) && strings.HasPrefix(e.Key, "net/netfilter/"):
		return "is the nf_conntrack module loaded?"
	case errors.Is(e.Err, syscall.ENOENT) && strings.HasPrefix(e.Key, "net/ipv4/vs/"):
		return "is the ip_vs module loaded?"
	}
	return ""
}

// Unwrap returns Err.
func (e *SettingError) Unwrap() error { return e.Err }

// ConntrackMax returns the nf_conntrack_max that kube-proxy computes for
// c on a node of numCPU CPUs, or 0 when c.MaxPerCore is 0 (leave it
// alone). As in kube-proxy, the cap applies to the product alone: a
// product above [ConntrackMaxLimit] gives the limit, and otherwise the
// larger of the product and c.Min (so a Min above the limit wins over a
// smaller product).
func ConntrackMax(c Conntrack, numCPU int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	scaled := int(c.MaxPerCore) * numCPU
	if scaled > ConntrackMaxLimit {
		return ConntrackMaxLimit
	}
	return max(scaled, int(c.Min))
}
