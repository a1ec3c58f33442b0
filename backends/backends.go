package backends

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Config configures whichever backend [New] builds, and what [CleanupAll]
// removes, the way kube-proxy's KubeProxyConfiguration does: the common
// part, then one section per backend with the backend's own Config. Only
// the chosen backend's section is read by New; CleanupAll reads every
// section for the names of what to remove. The proxier.Config embedded in
// a section is ignored: the common one takes its place. The zero value is
// valid for every backend but eBPF, which needs EBPF.CgroupPath.
type Config struct {
	// Config is the engine's configuration and the dataplane options
	// every backend shares.
	proxier.Config

	// NFTables are the nftables backend's options (table name,
	// masquerade bit, ...).
	NFTables nftables.Config
	// IPTables are the iptables backend's options (chain prefix,
	// masquerade bit, flavour, ...).
	IPTables iptables.Config
	// IPVS are the IPVS backend's options (scheduler, interface and
	// table names, masquerade bit, ...).
	IPVS ipvs.Config
	// EBPF are the eBPF backend's options. CgroupPath is required to
	// build it, not to clean it up.
	EBPF ebpf.Config
}

// The sections with the common configuration in place.

func (c Config) nftables() nftables.Config {
	s := c.NFTables
	s.Config = c.Config
	return s
}

func (c Config) iptables() iptables.Config {
	s := c.IPTables
	s.Config = c.Config
	return s
}

func (c Config) ipvs() ipvs.Config {
	s := c.IPVS
	s.Config = c.Config
	return s
}

func (c Config) ebpf() ebpf.Config {
	s := c.EBPF
	s.Config = c.Config
	return s
}

// entry is one backend of the registry.
type entry struct {
	name string
	// new builds the backend's Proxier.
	new func(cfg Config) (proxier.Proxier, error)
	// cleanup removes what the backend's proxiers left, without one.
	cleanup func(ctx context.Context, cfg Config) error
	// inspect reads back what the backend programmed in one family,
	// without a proxier; nil while the backend cannot.
	inspect func(ctx context.Context, cfg Config, f model.IPFamily) ([]proxier.Frontend, error)
}

// registry lists the backends, sorted by name.
func registry() []entry {
	return []entry{
		{
			name: "ebpf",
			new: func(cfg Config) (proxier.Proxier, error) {
				if cfg.EBPF.CgroupPath == "" {
					return nil, errors.New("backends: the ebpf backend needs Config.EBPF.CgroupPath, the cgroup v2 directory whose processes' sockets it translates (e.g. /sys/fs/cgroup)")
				}
				return ebpf.New(cfg.ebpf())
			},
			cleanup: func(ctx context.Context, cfg Config) error { return ebpf.Cleanup(ctx, cfg.ebpf()) },
			inspect: func(ctx context.Context, cfg Config, f model.IPFamily) ([]proxier.Frontend, error) {
				return ebpf.Inspect(ctx, cfg.ebpf(), f)
			},
		},
		{
			name:    "iptables",
			new:     func(cfg Config) (proxier.Proxier, error) { return iptables.New(cfg.iptables()) },
			cleanup: func(ctx context.Context, cfg Config) error { return iptables.Cleanup(ctx, cfg.iptables()) },
			inspect: func(ctx context.Context, cfg Config, f model.IPFamily) ([]proxier.Frontend, error) {
				return iptables.Inspect(ctx, cfg.iptables(), f)
			},
		},
		{
			// Fails with an error matching proxier.ErrNotSupported on a
			// kernel without IPVS.
			name:    "ipvs",
			new:     func(cfg Config) (proxier.Proxier, error) { return ipvs.New(cfg.ipvs()) },
			cleanup: func(ctx context.Context, cfg Config) error { return ipvs.Cleanup(ctx, cfg.ipvs()) },
			inspect: func(ctx context.Context, cfg Config, f model.IPFamily) ([]proxier.Frontend, error) {
				return ipvs.Inspect(ctx, cfg.ipvs(), f)
			},
		},
		{
			name:    "nftables",
			new:     func(cfg Config) (proxier.Proxier, error) { return nftables.New(cfg.nftables()) },
			cleanup: func(ctx context.Context, cfg Config) error { return nftables.Cleanup(ctx, cfg.nftables()) },
			inspect: func(ctx context.Context, cfg Config, f model.IPFamily) ([]proxier.Frontend, error) {
				return nftables.Inspect(ctx, cfg.nftables(), f)
			},
		},
	}
}

// Names returns the names of the backends, sorted: "ebpf", "iptables",
// "ipvs" and "nftables".
func Names() []string {
	var names []string
	for _, e := range registry() {
		names = append(names, e.name)
	}
	return names
}

// New returns the named backend's Proxier, configured by cfg's common
// part and the backend's section. A kernel that lacks what the backend
// needs fails it with an error matching [proxier.ErrNotSupported], and
// so does a scheduler the backend does not implement (see
// [proxier.Scheduler]).
func New(name string, cfg Config) (proxier.Proxier, error) {
	for _, e := range registry() {
		if e.name == name {
			return e.new(cfg)
		}
	}
	return nil, fmt.Errorf("unknown backend %q (have: %s)", name, strings.Join(Names(), ", "))
}

// Inspect reads back from the kernel, without a proxier, what the named
// backend programmed in the namespace cfg names, per family of
// cfg.Families (both when empty), with the names of the backend's
// section of cfg (defaults when unset). A family the backend has
// programmed nothing in has no frontends. Unlike [proxier.Engine.Inspect]
// it knows no desired state: it cannot name the service ports.
func Inspect(ctx context.Context, name string, cfg Config) (map[model.IPFamily][]proxier.Frontend, error) {
	for _, e := range registry() {
		if e.name != name {
			continue
		}
		if e.inspect == nil {
			return nil, fmt.Errorf("backends: %s cannot read back what it programmed yet", name)
		}
		fams := cfg.Families
		if len(fams) == 0 {
			fams = []model.IPFamily{model.IPv4, model.IPv6}
		}
		out := map[model.IPFamily][]proxier.Frontend{}
		for _, f := range fams {
			fs, err := e.inspect(ctx, cfg, f)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", name, f, err)
			}
			out[f] = fs
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown backend %q (have: %s)", name, strings.Join(Names(), ", "))
}

// CleanupAll removes what every backend created in the namespace cfg
// names (cfg.NetNS, for the families of cfg.Families), except the
// backend named keep (empty: remove all). The names of what to remove
// (tables, chain prefixes, interfaces, pin paths) are those of each
// backend's section of cfg, defaults when unset. Each backend's own
// Cleanup function does it, without building a proxier. A backend this
// kernel cannot run is skipped: it cannot have left anything. What a live
// proxier holds is refused and kept (the error says so). Use it for
// --cleanup, and after switching a node to another backend (once the new
// one has synced, so service never stops).
func CleanupAll(ctx context.Context, cfg Config, keep string) error {
	var errs []error
	for _, e := range registry() {
		if e.name == keep {
			continue
		}
		if err := e.cleanup(ctx, cfg); err != nil && !errors.Is(err, proxier.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("%s: %w", e.name, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveLeftovers removes, at a proxier's start, what the other backends
// left in the namespace cfg names, as kube-proxy removes its other modes'
// rules when it starts: after a switch of backend, the old rules would
// otherwise keep catching traffic. It is CleanupAll keeping the backend
// named keep, and best effort: a backend whose objects a live proxier
// holds is refused (see New) and left alone, and every failure is
// returned, joined, for the caller to log.
func RemoveLeftovers(ctx context.Context, cfg Config, keep string) error {
	return CleanupAll(ctx, cfg, keep)
}
