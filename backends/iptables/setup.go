package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Defaults of [Config].
const (
	DefaultChainPrefix = "PROXYKIT"
	DefaultLockWait    = iptables.DefaultWait
	// DefaultRewriteInterval is kube-proxy's interval of complete
	// rewrites.
	DefaultRewriteInterval = time.Hour
)

// Mode selects the iptables flavour.
type Mode string

// The modes.
const (
	// ModeAuto uses the flavour the namespace already uses (see
	// [Config.Mode]).
	ModeAuto Mode = ""
	// ModeLegacy uses iptables-legacy (x_tables).
	ModeLegacy Mode = "legacy"
	// ModeNFT uses iptables-nft (nf_tables through nft_compat).
	ModeNFT Mode = "nft"
)

// Config configures the iptables backend. The zero value is valid.
type Config struct {
	proxier.Config

	// ChainPrefix starts the name of every chain the backend creates
	// ("PROXYKIT-SERVICES", "PROXYKIT-SVC-<hash>", ...), so that it can
	// run beside kube-proxy ("KUBE-") or another instance. Empty means
	// [DefaultChainPrefix]; at most 10 letters, digits, '-' or '_'.
	ChainPrefix string
	// MasqueradeBit is the packet mark bit that asks for masquerading in
	// postrouting. Zero means [proxier.DefaultMasqueradeBit] (kube-proxy's).
	MasqueradeBit uint32
	// Mode selects the iptables flavour. [ModeAuto] detects it the way
	// kube-proxy does: the flavour holding our chains or kubelet's hint
	// chains, else the one with more rules, else nft.
	Mode Mode
	// LockWait bounds the wait for the xtables lock (iptables -w) of the
	// legacy flavour. Zero means [DefaultLockWait].
	LockWait time.Duration
	// RewriteInterval is the least time between two complete rewrites of
	// the backend's chains on periodic full syncs; in between, a full
	// sync checks the canary chains and the jumps from the built-in
	// chains and writes what differs from the state kept in memory (a
	// rewrite of 10,000 services takes seconds). Rules of ours edited
	// in place by someone else are repaired by the next rewrite. The
	// first sync, a sync after a failure and one that finds our chains
	// flushed always rewrite. Zero means [DefaultRewriteInterval];
	// negative rewrites on every full sync.
	RewriteInterval time.Duration
	// NoLocalhostNodePorts turns off node ports on 127.0.0.1 (kube-proxy's
	// --iptables-localhost-nodeports=false). By default, as in
	// kube-proxy, IPv4 node ports also answer on 127.0.0.0/8 when the
	// node port addresses include it (none configured includes
	// everything): the backend sets net.ipv4.conf.all.route_localnet=1
	// in the namespace, masquerades that traffic and drops packets to
	// 127.0.0.0/8 from other sources that no node port took. IPv6 never
	// has localhost node ports.
	NoLocalhostNodePorts bool
}

// WithDefaults returns c with every zero field that has a default filled in.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.ChainPrefix == "" {
		c.ChainPrefix = DefaultChainPrefix
	}
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = proxier.DefaultMasqueradeBit
	}
	if c.LockWait <= 0 {
		c.LockWait = DefaultLockWait
	}
	if c.RewriteInterval == 0 {
		c.RewriteInterval = DefaultRewriteInterval
	}
	return c
}

// New returns a Proxier that programs cfg.NetNS with iptables, one
// backend per IP family of cfg.Families: iptables-restore for IPv4,
// ip6tables-restore for IPv6, of the flavour cfg.Mode selects (detected
// once for both).
//
// New checks the programs first; if one is missing or too old, or lacks
// an extension the backend uses, the error is an [*proxier.UnsupportedError]
// matching [proxier.ErrNotSupported] and naming what is missing.
func New(cfg Config) (proxier.Proxier, error) {
	cfg = cfg.WithDefaults()
	if cfg.Mode == ModeAuto {
		m, err := detect(cfg)
		if err != nil {
			return nil, err
		}
		cfg.Mode = m
	}
	return proxier.NewPerFamily(cfg.Config, func(f model.IPFamily) (proxier.Backend, error) {
		return NewBackend(cfg, f)
	})
}

// setupTimeout bounds the programs New and NewBackend run. Detecting
// the flavour may read both flavours' whole rule sets (the nft one's only
// when no flavour has a hint chain), which takes tens of seconds when a
// predecessor left 30,000 services' rules on a loaded node
// (TestRestartAtScale): the bound is for a hung program, not for a big
// rule set.
const setupTimeout = 2 * time.Minute

func detect(cfg Config) (Mode, error) {
	if _, err := newNames(cfg.ChainPrefix); err != nil {
		return "", fmt.Errorf("iptables: %w", err)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return "", fmt.Errorf("iptables: %w", err)
	}
	defer ns.Close()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	fl, err := iptables.Detect(ctx, ns, cfg.ChainPrefix)
	if err != nil {
		return "", unsupported(err)
	}
	return Mode(fl), nil
}

// NewBackend returns the backend of one IP family, for use without the
// engine (tests, or a caller that computes targets itself). It opens
// cfg.NetNS, detects the flavour unless cfg.Mode names one, and checks
// the programs like [New].
func NewBackend(cfg Config, family model.IPFamily) (proxier.Backend, error) {
	cfg = cfg.WithDefaults()
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("iptables: unknown IP family %v", family)
	}
	if bit := cfg.MasqueradeBit; bit&(bit-1) != 0 {
		return nil, fmt.Errorf("iptables: masquerade bit %#x is not a single bit", bit)
	}
	n, err := newNames(cfg.ChainPrefix)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	if cfg.Mode != ModeAuto && cfg.Mode != ModeLegacy && cfg.Mode != ModeNFT {
		return nil, fmt.Errorf("iptables: unknown mode %q", cfg.Mode)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	var lock *ownerlock.Lock
	closeAll := func() { lock.Release(); ns.Close() }
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	fl := iptables.Flavour(cfg.Mode)
	if cfg.Mode == ModeAuto {
		if fl, err = iptables.Detect(ctx, ns, cfg.ChainPrefix); err != nil {
			closeAll()
			return nil, unsupported(err)
		}
	}
	// One proxier per flavour, family and chain prefix: a second one
	// would rewrite the first one's chains and silently kill its
	// services.
	if lock, err = ownerlock.Acquire(ns, fmt.Sprintf("iptables %s %s %s", fl, family, cfg.ChainPrefix)); err != nil {
		ns.Close()
		return nil, fmt.Errorf("iptables: %s %s chains %s*: %w", fl, family, cfg.ChainPrefix, err)
	}
	tools, err := iptables.FindTools(family, fl)
	if err != nil {
		closeAll()
		return nil, unsupported(err)
	}
	run, err := iptables.NewRunner(ctx, ns, tools, cfg.LockWait)
	if err != nil {
		closeAll()
		return nil, unsupported(err)
	}
	if !run.Version().AtLeast(1, 6, 2) {
		closeAll()
		return nil, &proxier.UnsupportedError{Backend: "iptables", What: "iptables 1.6.2 or later (" + tools.Cmd + " is " + run.Version().String() + ")"}
	}
	b := &backend{
		cfg:  cfg,
		fam:  family,
		ns:   ns,
		lock: lock,
		run:  run,
		r:    newRenderer(cfg, family, n, run.HasRandomFully()),
		log:  cfg.Logger.With("backend", "iptables", "family", family.String(), "flavour", string(fl)),
	}
	if b.metrics, err = newRuleMetrics(cfg.Config, family); err != nil {
		b.Close()
		return nil, fmt.Errorf("iptables: %w", err)
	}
	if err := b.probe(ctx); err != nil {
		b.Close()
		return nil, err
	}
	if b.r.localhost {
		// Without it, the kernel drops packets DNATed away from
		// 127.0.0.0/8 as martians. kube-proxy sets it too (and leaves
		// it set).
		changed, err := ns.SetSysctl("net/ipv4/conf/all/route_localnet", "1")
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("iptables: localhost node ports (NoLocalhostNodePorts turns them off): %w", err)
		}
		if changed {
			b.log.Info("set net.ipv4.conf.all.route_localnet=1 for node ports on 127.0.0.1")
		}
	}
	return b, nil
}

func unsupported(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		// A program that took too long is no missing feature: callers
		// that fall back to another backend on ErrNotSupported must
		// not.
		return fmt.Errorf("iptables: the iptables programs did not finish within %v: %w", setupTimeout, err)
	}
	var me *iptables.MissingError
	if errors.As(err, &me) {
		return &proxier.UnsupportedError{Backend: "iptables", What: "program " + me.Program, Err: me.Err}
	}
	return &proxier.UnsupportedError{Backend: "iptables", What: "a working iptables", Err: err}
}

// probe has the restore program parse (without committing) a rule set
// that uses every extension the backend writes, so a missing one fails
// New instead of the first sync.
func (b *backend) probe(ctx context.Context) error {
	a := func(s string) netip.Addr {
		if b.fam == model.IPv6 {
			return netip.MustParseAddr("2001:db8::" + strings.ReplaceAll(s, ".", ""))
		}
		return netip.MustParseAddr("192.0.2." + s)
	}
	ep := &model.Endpoint{Addr: netip.AddrPortFrom(a("10"), 8080), Ready: true, Serving: true, Local: true}
	sp := &model.ServicePort{
		Name:      model.ServicePortName{ServiceName: model.ServiceName{Namespace: "probe", Name: "probe"}, Protocol: model.SCTP},
		ClusterIP: a("1"), Port: 80, Protocol: model.SCTP, NodePort: 30000,
		LoadBalancerIPs:          []netip.Addr{a("2")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.PrefixFrom(a("0"), 24)},
		SessionAffinity:          true, ExternalPolicy: model.PolicyLocal,
	}
	none := &model.ServicePort{Name: model.ServicePortName{ServiceName: model.ServiceName{Namespace: "probe", Name: "none"}, Protocol: model.UDP},
		ClusterIP: a("3"), Port: 53, Protocol: model.UDP, NodePort: 30001}
	var want [numTables]map[model.ServicePortName]*tableRules
	for _, x := range []struct {
		sp *model.ServicePort
		t  *proxier.Targets
	}{
		{sp, &proxier.Targets{Internal: []*model.Endpoint{ep}, External: []*model.Endpoint{ep}, HasEndpoints: true}},
		{none, &proxier.Targets{}},
	} {
		rd, err := b.r.service(x.sp.Name, x.sp, x.t)
		if err != nil {
			return fmt.Errorf("iptables: probe: %w", err)
		}
		for t := range numTables {
			if want[t] == nil {
				want[t] = map[model.ServicePortName]*tableRules{}
			}
			want[t][x.sp.Name] = rd[t]
		}
	}
	in := b.fullSections(want, [numTables][]string{}, 0, [numTables]jumpMode{jumpsInsert, jumpsInsert}, false)[0]
	err := b.run.Test(ctx, in.b)
	var re *iptables.RestoreError
	if errors.As(err, &re) {
		what := "support for the rule set"
		if re.Line > 0 {
			what = "support for `" + re.Text + "`"
		}
		return &proxier.UnsupportedError{Backend: "iptables", What: what, Err: err}
	}
	if err != nil {
		return fmt.Errorf("iptables: probe: %w", err)
	}
	return nil
}
