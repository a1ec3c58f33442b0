package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"time"

	mipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// New returns a Proxier that programs cfg.NetNS with IPVS, one backend
// per IP family of cfg.Families.
//
// New probes the kernel first; if it lacks IPVS or a netfilter feature
// the backend needs, the error matches [proxier.ErrNotSupported] and is an
// [*proxier.UnsupportedError] naming it.
func New(cfg Config) (proxier.Proxier, error) {
	cfg = cfg.WithDefaults()
	return proxier.NewPerFamily(cfg.Config, func(f model.IPFamily) (proxier.Backend, error) {
		return NewBackend(cfg, f)
	})
}

// backend programs one IP family of one network namespace.
type backend struct {
	cfg   Config
	fi    family
	ns    *netns.NS
	lock  *ownerlock.Lock // this table in this namespace is ours
	nl    *netlink.Handle
	links *links
	ipvs  *ipvsTable
	nft   *nftConn
	log   *slog.Logger
	now   func() time.Time

	// st is what the kernel holds as of the last successful sync; nil
	// when unknown (before the first sync, after Cleanup).
	st *state
	// dirty says the kernel may differ from st (an operation failed):
	// the next sync is a full one.
	dirty bool
	// draining holds the removed TCP real servers kept with weight 0
	// until their connections end or their deadline passes.
	draining map[vsKey]map[netip.AddrPort]time.Time
	link     netlink.Link
	// nodeIPs are the Node's addresses when the node's addresses were
	// last read.
	nodeIPs []netip.Addr
}

var _ proxier.Backend = (*backend)(nil)

// NewBackend returns the backend of one IP family, for use without the
// engine (tests, or a caller that computes targets itself). It opens
// cfg.NetNS and probes the kernel like [New].
func NewBackend(cfg Config, f model.IPFamily) (proxier.Backend, error) {
	cfg = cfg.WithDefaults()
	if f != model.IPv4 && f != model.IPv6 {
		return nil, fmt.Errorf("ipvs: unknown IP family %v", f)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	// One proxier per table: a second one would adopt the first one's
	// virtual servers and silently fight over them.
	lock, err := ownerlock.Acquire(ns, fmt.Sprintf("ipvs %s %s", f, cfg.TableName))
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("ipvs: %s table %s: %w", f, cfg.TableName, err)
	}
	b := &backend{
		cfg:      cfg,
		fi:       newFamily(f, cfg.TableName),
		ns:       ns,
		lock:     lock,
		log:      cfg.Logger.With("backend", "ipvs", "family", f.String()),
		now:      time.Now,
		draining: map[vsKey]map[netip.AddrPort]time.Time{},
	}
	// Route netlink for links and addresses, generic netlink to find
	// IPVS. No XFRM: netlink.NewHandleAt's default would ask for it.
	if b.nl, err = ns.NetlinkHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC); err != nil {
		b.Close()
		return nil, fmt.Errorf("ipvs: netlink handle: %w", err)
	}
	b.links = &links{h: b.nl, name: cfg.InterfaceName}
	if err := b.probeIPVS(); err != nil {
		b.Close()
		return nil, err
	}
	var h *mipvs.Handle
	// moby/ipvs opens its socket in the calling thread's namespace:
	// call it on a thread inside ours.
	if err := ns.Do(func() error {
		var err error
		h, err = mipvs.New("")
		return err
	}); err != nil {
		b.Close()
		return nil, fmt.Errorf("ipvs: open IPVS netlink socket: %w", err)
	}
	b.ipvs = &ipvsTable{h: h, fam: f}
	if b.nft, err = dialNft(ns); err != nil {
		b.Close()
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	if err := b.nft.probe(b.fi, &b.cfg); err != nil {
		b.Close()
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("ipvs: nftables probe: %w (CAP_NET_ADMIN is needed)", err)
		}
		return nil, &proxier.UnsupportedError{Backend: "ipvs", What: "the nftables rules the backend needs (nf_tables, nft_ct, nft_reject, nft_masq, nft_chain_nat, concatenated interval sets)", Err: err}
	}
	return b, nil
}

// probeIPVS checks that the kernel has IPVS, loading ip_vs once if its
// generic netlink family is missing.
func (b *backend) probeIPVS() error {
	if _, err := b.nl.GenlFamilyGet("IPVS"); err == nil {
		return nil
	}
	// Like kube-proxy, load the module if the kernel has it. The
	// module is global; its state is per namespace.
	_ = exec.Command("modprobe", "ip_vs").Run()
	if _, err := b.nl.GenlFamilyGet("IPVS"); err != nil {
		return &proxier.UnsupportedError{Backend: "ipvs", What: "IPVS (ip_vs)", Err: err}
	}
	return nil
}

// Name returns "ipvs".
func (b *backend) Name() string { return "ipvs" }

// Family returns the backend's IP family.
func (b *backend) Family() model.IPFamily { return b.fi.fam }

// WithoutShortCircuit marks the backend as [proxier.WithoutShortCircuit]:
// the virtual servers of the external addresses of a service with
// externalTrafficPolicy Local hold the local endpoints for every source,
// pods and the node included, as in kube-proxy's ipvs mode.
func (b *backend) WithoutShortCircuit() {}

var _ proxier.WithoutShortCircuit = (*backend)(nil)

// sysctls are the settings IPVS needs in the namespace (they apply to
// both families).
func (b *backend) sysctls() [][2]string {
	s := [][2]string{
		// Let netfilter track IPVS connections, so masquerading
		// in postrouting applies to them.
		{"net/ipv4/vs/conntrack", "1"},
		// Drop connections to deleted real servers at once, so
		// clients reconnect elsewhere.
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		// Forget persistence templates of real servers with weight 0.
		{"net/ipv4/vs/expire_quiescent_template", "1"},
	}
	if b.cfg.StrictARP {
		s = append(s, [2]string{"net/ipv4/conf/all/arp_ignore", "1"}, [2]string{"net/ipv4/conf/all/arp_announce", "2"})
	}
	return s
}

// setup applies the namespace-wide settings.
func (b *backend) setup(ctx context.Context) error {
	for _, kv := range b.sysctls() {
		if _, err := b.ns.SetSysctl(kv[0], kv[1]); err != nil {
			return fmt.Errorf("ipvs: %w", err)
		}
	}
	if b.cfg.TCPTimeout > 0 || b.cfg.TCPFinTimeout > 0 || b.cfg.UDPTimeout > 0 {
		if err := b.ipvs.h.SetConfig(&mipvs.Config{
			TimeoutTCP: b.cfg.TCPTimeout, TimeoutTCPFin: b.cfg.TCPFinTimeout, TimeoutUDP: b.cfg.UDPTimeout,
		}); err != nil {
			return fmt.Errorf("ipvs: set connection timeouts: %w", err)
		}
	}
	return ctx.Err()
}
