package ebpf

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Defaults of [Config].
const (
	// DefaultTableName is the nftables table of the north-south rules.
	DefaultTableName = "proxykit-ebpf"
	// DefaultMaxServices is the size of the frontend maps, per family.
	DefaultMaxServices = 1 << 16
	// DefaultMaxBackends is the size of the endpoint slot maps, per family.
	DefaultMaxBackends = 1 << 18
	// DefaultMaxAffinity is the size of the session affinity maps, per
	// family.
	DefaultMaxAffinity = 1 << 16
	// DefaultMaxSockets is the size of the reverse translation map.
	DefaultMaxSockets = 1 << 16
	// DefaultMaglevTableSize is the number of entries of a Maglev table:
	// a prime about 100 times the endpoints of a typical service, so
	// that endpoints hold within 1% of the same share up to 10 endpoints,
	// and within 10% up to 100.
	DefaultMaglevTableSize = 1021
	// DefaultMaxMaglevTables is the size of the Maglev table maps, per
	// family, with [proxier.SchedulerMaglev]: 68 MB per family at the default
	// table size.
	DefaultMaxMaglevTables = 1 << 14
	// DefaultMaxMaglevTablesRandom is the size of the Maglev table maps,
	// per family, with [proxier.SchedulerRandom], where only the service ports
	// whose Scheduler asks for Maglev use a table: about 1 MiB per
	// family at the default table size.
	DefaultMaxMaglevTablesRandom = 256
)

// Schedulers returns, in a new slice, the schedulers the backend
// implements: how the socket programs pick a service's endpoint for a
// new connection (and, with session affinity, for a client without a
// live affinity entry).
//
//   - [proxier.SchedulerRandom] picks an endpoint at random for every
//     connect and every unconnected UDP datagram. It is the default.
//   - [proxier.SchedulerMaglev] picks by Maglev consistent hashing:
//     every endpoint group has a lookup table of Config.MaglevTableSize
//     entries, indexed by a hash of the client socket's identity (its
//     network namespace, source address and port when it has a local
//     port; otherwise the socket's cookie). A client identity keeps its
//     endpoint while the endpoint stays, and when one endpoint of N
//     leaves or joins, about 1/N of the identities move. See README.md.
//
// Config.Scheduler is the proxier's; a service port can ask for another
// one with its Scheduler ([model.ServicePort.Scheduler], the
// proxykit.io/scheduler annotation): "mh" or "maglev" (Cilium's name)
// for Maglev, "random" for random. Empty, or any other value (logged
// once per service port and value), means Config.Scheduler.
func Schedulers() []proxier.Scheduler {
	return []proxier.Scheduler{proxier.SchedulerRandom, proxier.SchedulerMaglev}
}

// Config configures the eBPF backend. CgroupPath is required; every other
// zero field means a default.
type Config struct {
	proxier.Config

	// CgroupPath is the cgroup v2 directory the socket programs are
	// attached to: sockets of every process in it and in its descendants
	// are translated (when they are in a translated network namespace).
	// A node agent passes the cgroup holding the node's processes and
	// pods, e.g. /sys/fs/cgroup; tests pass a cgroup of their own.
	// Required.
	CgroupPath string
	// PinPath is a directory on a bpffs where the maps and the program
	// links are pinned, so that they outlive the process: a restarted
	// proxier adopts the maps with their contents (affinity, reverse
	// translations) and replaces the programs atomically, and Cleanup by
	// another process finds them. Empty means nothing is pinned: the
	// programs are detached when the proxier is closed (the composed
	// nftables rules keep serving in the meantime).
	PinPath string
	// PodNetNS are paths of further network namespaces whose sockets are
	// translated besides NetNS (the node's), typically the node's pods.
	// It is the initial list: [Proxier.AddPodNetNS] and
	// [Proxier.RemovePodNetNS] change it while the proxier runs. The
	// backend holds each namespace open until it is removed or the
	// proxier is closed.
	PodNetNS []string
	// AllNetNS translates sockets of every network namespace under
	// CgroupPath, for an agent in the host namespace whose cgroup holds
	// every pod. PodNetNS then only names where connected UDP sockets of
	// removed endpoints are looked for.
	AllNetNS bool
	// SocketOnly programs the socket hooks alone, without the nftables
	// table that handles traffic from outside the node (node ports,
	// external and load-balancer IPs, source ranges), SCTP, and sockets
	// outside CgroupPath or outside the translated namespaces.
	SocketOnly bool
	// TableName names the nftables table of the north-south rules.
	// Empty means [DefaultTableName].
	TableName string
	// NorthSouth chooses what serves traffic from outside the node
	// (node ports, external and load-balancer IPs): [NorthSouthNFTables]
	// (empty: the composed nftables table), [NorthSouthTC] (tc
	// programs, no netfilter rule; see tc.go) or [NorthSouthXDP] (an
	// XDP program in front of the tc programs; see xdp.go). Ignored
	// with SocketOnly unless it is tc or xdp, which SocketOnly
	// contradicts.
	NorthSouth NorthSouth
	// NorthSouthDevices names the node's external interfaces, where
	// the tc (and XDP) programs serve frontends with [NorthSouthTC] and
	// [NorthSouthXDP]. Empty means
	// every Ethernet interface of NetNS holding a global address with a
	// prefix shorter than a host route. Every other Ethernet interface
	// (the node side of pod veths) gets the program that translates
	// replies only.
	NorthSouthDevices []string
	// NorthSouthSNATPorts is the first and last source port the tc
	// programs give the flows they SNAT to the node (a remote endpoint
	// with externalTrafficPolicy Cluster). Each endpoint address and port
	// has this many flows open at once; a closed TCP flow's port (a FIN
	// each way, or a RST) and an idle UDP flow's (about 2 minutes) are
	// taken again when no free one is found. A flow keeps the client's
	// port when the range holds it, else takes the port's image in the
	// range; the range should be at least as wide as the clients'
	// ephemeral ranges (Linux: 28,232 ports), so that each client tuple
	// keeps its own SNAT tuple. Zero means the widest run of ports from
	// 1024 to 65535 outside the node's ephemeral range
	// (net.ipv4.ip_local_port_range in NetNS): 1024-32767 with Linux's
	// default. It must not overlap the ephemeral range: the node's own
	// connections would take the same tuples.
	NorthSouthSNATPorts [2]uint16
	// NorthSouthXDPVeth lets the XDP program of [NorthSouthXDP] send
	// packets out of external interfaces that are veths. Set it only
	// where the far end of every such veth takes XDP frames (it runs
	// an XDP program, or has GRO on: the kernel drops them otherwise)
	// and sends complete checksums (no transmit checksum offload, as
	// packets from the wire have them: XDP cannot finish a partial
	// one), as in test rigs and nested nodes. Without it the XDP
	// program passes such packets on to tc.
	NorthSouthXDPVeth bool
	// NorthSouthForwarding is how the tc and XDP programs send traffic
	// from outside to an endpoint on another node: [ForwardingSNAT]
	// (empty: SNAT to the node, as kube-proxy), [ForwardingDSR] (direct
	// server return) or [ForwardingHybrid] (DSR for TCP, SNAT for
	// UDP). A Service's proxykit.io/forwarding-mode annotation ("snat"
	// or "dsr", [model.ServicePort.ForwardingMode]) overrides it for
	// its ports.
	NorthSouthForwarding Forwarding
	// tcLegacy attaches the tc programs with a clsact qdisc and a
	// cls_bpf filter even where the kernel has tcx (6.6+): tests cover
	// both paths with it.
	tcLegacy bool

	// MaxServices bounds the frontends (cluster IP, node port, external
	// and load-balancer IP, each per port) per family. Zero means
	// [DefaultMaxServices].
	MaxServices int
	// MaxBackends bounds the endpoint slots per family (a service port
	// uses one per endpoint, two when its external traffic has other
	// endpoints than its cluster traffic). Zero means
	// [DefaultMaxBackends].
	MaxBackends int
	// MaxAffinity bounds the remembered (client, service) pairs of
	// session affinity per family; the least recently used are evicted.
	// Zero means [DefaultMaxAffinity].
	MaxAffinity int
	// MaxSockets bounds the remembered translations that recvmsg and
	// getpeername undo; the least recently used are evicted. Zero means
	// [DefaultMaxSockets].
	MaxSockets int

	// Scheduler is how an endpoint is picked for a new connection by
	// the service ports that do not ask for one of their own: those
	// whose Scheduler is empty or unknown. It is one of [Schedulers]
	// (Cilium's bpf-lb-algorithm: random or maglev); empty means
	// [proxier.SchedulerRandom]. Another name fails New with an
	// [*proxier.UnsupportedError].
	Scheduler proxier.Scheduler
	// MaglevTableSize is the number of entries of each Maglev table, a
	// prime of at most 131071. The larger it is relative to a group's
	// endpoints, the more evenly they share the clients (about 100
	// entries per endpoint keep the shares within 1% of each other) and
	// the fewer clients of other endpoints move when one comes or goes;
	// a group with more endpoints than entries picks at random. Zero
	// means [DefaultMaglevTableSize]. Used by the service ports that
	// pick with Maglev.
	MaglevTableSize int
	// MaxMaglevTables bounds the Maglev tables per family: one per
	// endpoint group with endpoints of a service port that picks with
	// Maglev (a service port has one group, two when its external
	// traffic has other endpoints than its cluster traffic). The maps
	// are preallocated: each table takes 4 × MaglevTableSize bytes plus
	// about 64 bytes of map overhead, 4.1 KiB at the default size.
	// Service ports beyond the limit pick at random (a warning is
	// logged at every sync that leaves one out) until a sync finds
	// room. Zero means [DefaultMaxMaglevTables] (16,384 tables: 68 MB
	// per family; 10,000 take 41 MB) with [proxier.SchedulerMaglev], and
	// [DefaultMaxMaglevTablesRandom] (256 tables: 1 MiB per family) with
	// [proxier.SchedulerRandom], where only service ports whose Scheduler asks
	// for Maglev use a table.
	MaxMaglevTables int
}

// WithDefaults returns c with every zero field that has a default filled
// in.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.TableName == "" {
		c.TableName = DefaultTableName
	}
	if c.Scheduler == "" {
		c.Scheduler = proxier.SchedulerRandom
	} else if s, ok := c.Scheduler.Canonical(); ok {
		c.Scheduler = s
	}
	if c.MaxServices <= 0 {
		c.MaxServices = DefaultMaxServices
	}
	if c.MaxBackends <= 0 {
		c.MaxBackends = DefaultMaxBackends
	}
	if c.MaxAffinity <= 0 {
		c.MaxAffinity = DefaultMaxAffinity
	}
	if c.MaxSockets <= 0 {
		c.MaxSockets = DefaultMaxSockets
	}
	if c.MaglevTableSize <= 0 {
		c.MaglevTableSize = DefaultMaglevTableSize
	}
	if c.MaxMaglevTables <= 0 {
		c.MaxMaglevTables = DefaultMaxMaglevTablesRandom
		if c.Scheduler == proxier.SchedulerMaglev {
			c.MaxMaglevTables = DefaultMaxMaglevTables
		}
	}
	return c
}

// check reports a configuration that cannot work.
func (c *Config) check() error {
	if c.CgroupPath == "" {
		return errors.New("ebpf: Config.CgroupPath is required")
	}
	if _, err := proxier.ResolveScheduler("ebpf", c.Scheduler, Schedulers()); err != nil {
		return err
	}
	if err := c.checkNorthSouth(); err != nil { // north-south at tc (tc.go)
		return err
	}
	if err := c.checkForwarding(); err != nil {
		return err
	}
	return checkMaglevTableSize(c.MaglevTableSize)
}

// New returns a Proxier that translates services at the socket for the
// processes under cfg.CgroupPath in cfg.NetNS (and cfg.PodNetNS), and
// programs the nftables rules of the north-south traffic in cfg.NetNS,
// for each IP family of cfg.Families. The Proxier is a [*Proxier]; see
// [NewProxier].
//
// New probes the kernel and loads the programs (nothing is attached
// before the first sync); if the kernel lacks something, the error
// matches [proxier.ErrNotSupported] and names it.
func New(cfg Config) (proxier.Proxier, error) {
	p, err := NewProxier(cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Proxier is the eBPF backend's [proxier.Proxier]: the engine driving
// the backend of each family, and the set of translated pod network
// namespaces, which can change while it runs.
type Proxier struct {
	*proxier.Engine
	dp *dataplane
}

// NewProxier is [New] returning the concrete type, for callers that add
// and remove pod network namespaces while the proxier runs.
func NewProxier(cfg Config) (*Proxier, error) {
	cfg = cfg.WithDefaults()
	dp, err := newDataplane(cfg)
	if err != nil {
		return nil, err
	}
	tcp, err := newTCPlaneFor(cfg, dp) // nil unless NorthSouth is tc
	if err != nil {
		dp.release()
		return nil, err
	}
	e, err := proxier.NewPerFamily(cfg.Config, func(f model.IPFamily) (proxier.Backend, error) {
		return newBackendTC(cfg, f, dp, tcp)
	})
	dp.release() // the backends hold it now, or none was built
	tcp.release()
	if err != nil {
		return nil, err
	}
	return &Proxier{Engine: e, dp: dp}, nil
}

// AddPodNetNS starts translating the sockets of the network namespace
// at path (e.g. /var/run/netns/<pod> or /proc/<pid>/ns/net), as if it
// had been in Config.PodNetNS: a CNI agent calls it when it creates a
// pod's network. It takes effect at once, without a sync; sockets the
// pod connected before keep their destination. The proxier holds the
// namespace open until RemovePodNetNS or Close. Adding a namespace
// that is translated already does nothing.
func (p *Proxier) AddPodNetNS(path string) error { return p.dp.addPodNetNS(path) }

// RemovePodNetNS stops translating the sockets of a pod network
// namespace named by path in Config.PodNetNS or AddPodNetNS, and
// releases the proxier's handle on it: a CNI agent calls it when it
// deletes a pod's network (before or after removing the path). The
// namespace is found by identity while path still names it, else by
// the path. Removing a namespace that is not translated does nothing;
// the node's namespace (Config.NetNS) cannot be removed.
func (p *Proxier) RemovePodNetNS(path string) error { return p.dp.removePodNetNS(path) }

// NewBackend returns the backend of one IP family, for use without the
// engine. It loads the programs for itself: to drive both families of
// one cgroup, prefer [New], or give both backends the same PinPath.
func NewBackend(cfg Config, family model.IPFamily) (proxier.Backend, error) {
	cfg = cfg.WithDefaults()
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("ebpf: unknown IP family %v", family)
	}
	if !slices.Contains(cfg.Families, family) {
		// The maps of a family are sized by cfg.Families.
		cfg.Families = append(slices.Clone(cfg.Families), family)
	}
	dp, err := newDataplane(cfg)
	if err != nil {
		return nil, err
	}
	tcp, err := newTCPlaneFor(cfg, dp) // nil unless NorthSouth is tc
	if err != nil {
		dp.release()
		return nil, err
	}
	b, err := newBackendTC(cfg, family, dp, tcp)
	dp.release()
	tcp.release()
	if err != nil {
		return nil, err
	}
	return b, nil
}

// newBackendTC is newBackend that, with NorthSouth tc, drives the tc
// plane tcp (shared by the family backends) instead of the nftables
// backend, in the place of the composed table.
func newBackendTC(cfg Config, family model.IPFamily, dp *dataplane, tcp *tcPlane) (*backend, error) {
	if tcp == nil {
		return newBackend(cfg, family, dp)
	}
	cfg.SocketOnly = true // no nftables table
	b, err := newBackend(cfg, family, dp)
	if err != nil {
		return nil, err
	}
	b.cfg.SocketOnly = false
	b.nft = newTCBackend(tcp, family, b.log)
	return b, nil
}

func newBackend(cfg Config, family model.IPFamily, dp *dataplane) (*backend, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("ebpf: unknown IP family %v", family)
	}
	b := &backend{
		cfg:    cfg,
		family: family,
		codec:  codecFor(family),
		log:    cfg.Logger.With("backend", "ebpf", "family", family.String()),
	}
	b.svcMap, b.beMap, b.nodeMap, b.magMap = dp.familyMaps(family)
	b.warned = dp.warned
	b.rows = newRowWriter(cfg.MaglevTableSize, maphash.MakeSeed())
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	b.ns = ns
	if b.nl, err = ns.NetlinkHandle(unix.NETLINK_ROUTE); err != nil {
		ns.Close()
		return nil, fmt.Errorf("ebpf: netlink: %w", err)
	}
	if !cfg.SocketOnly {
		nft, err := nftables.NewBackend(nftables.Config{Config: cfg.Config, TableName: cfg.TableName}, family)
		if err != nil {
			b.nl.Close()
			ns.Close()
			return nil, fmt.Errorf("ebpf: north-south rules: %w", err)
		}
		b.nft = nft
	}
	dp.acquire(family)
	b.dp = dp
	return b, nil
}

// checkFS checks that path is a directory on a file system of type magic.
func checkFS(path string, magic int64, what string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("ebpf: %s %s: %w", what, path, err)
	}
	if int64(st.Type) != magic {
		return fmt.Errorf("ebpf: %s %s: wrong file system type %#x", what, path, st.Type)
	}
	return nil
}

var errClosed = errors.New("ebpf: backend is closed")
