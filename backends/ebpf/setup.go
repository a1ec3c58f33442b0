package ebpf

import (
	"errors"
	"fmt"

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
)

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
	// The list is fixed for the proxier's life, and the backend holds
	// each namespace open until Close.
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
}

// WithDefaults returns c with every zero field that has a default filled
// in.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.TableName == "" {
		c.TableName = DefaultTableName
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
	return c
}

// New returns a Proxier that translates services at the socket for the
// processes under cfg.CgroupPath in cfg.NetNS (and cfg.PodNetNS), and
// programs the nftables rules of the north-south traffic in cfg.NetNS,
// for each IP family of cfg.Families.
//
// New probes the kernel and loads the programs (nothing is attached
// before the first sync); if the kernel lacks something, the error
// matches [proxier.ErrNotSupported] and names it.
func New(cfg Config) (proxier.Proxier, error) {
	cfg = cfg.WithDefaults()
	dp, err := newDataplane(cfg)
	if err != nil {
		return nil, err
	}
	var backends []proxier.Backend
	closeAll := func() {
		for _, b := range backends {
			b.Close()
		}
	}
	for _, f := range cfg.Families {
		b, err := newBackend(cfg, f, dp)
		if err != nil {
			closeAll()
			dp.release()
			return nil, err
		}
		backends = append(backends, b)
	}
	dp.release() // the backends hold it now
	p, err := proxier.New(cfg.Config, backends...)
	if err != nil {
		closeAll()
		return nil, err
	}
	return p, nil
}

// NewBackend returns the backend of one IP family, for use without the
// engine. It loads the programs for itself: to drive both families of
// one cgroup, prefer [New], or give both backends the same PinPath.
func NewBackend(cfg Config, family model.IPFamily) (proxier.Backend, error) {
	cfg = cfg.WithDefaults()
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("ebpf: unknown IP family %v", family)
	}
	dp, err := newDataplane(cfg)
	if err != nil {
		return nil, err
	}
	b, err := newBackend(cfg, family, dp)
	dp.release()
	if err != nil {
		return nil, err
	}
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
	b.svcMap, b.beMap, b.nodeMap = dp.familyMaps(family)
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

// UnsupportedError says which kernel feature the backend found missing.
// It matches [proxier.ErrNotSupported].
type UnsupportedError struct {
	// Feature names what is missing, e.g. "helper bpf_set_retval in
	// cgroup sock_addr programs (kernel 5.18)".
	Feature string
	// Err is the kernel's answer.
	Err error
}

func (e *UnsupportedError) Error() string {
	return "ebpf: kernel lacks " + e.Feature + ": " + e.Err.Error()
}

// Is matches [proxier.ErrNotSupported].
func (e *UnsupportedError) Is(target error) bool { return target == proxier.ErrNotSupported }

// Unwrap returns the kernel's answer.
func (e *UnsupportedError) Unwrap() error { return e.Err }

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
