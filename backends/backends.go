package backends

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/proxier"
)

// Constructor builds a backend's Proxier from the shared configuration,
// with the backend's own options at their defaults.
type Constructor func(cfg proxier.Config) (proxier.Proxier, error)

// registry lists the backends by name.
var registry = map[string]Constructor{
	"nftables": func(cfg proxier.Config) (proxier.Proxier, error) {
		return nftables.New(nftables.Config{Config: cfg})
	},
	"iptables": func(cfg proxier.Config) (proxier.Proxier, error) {
		return iptables.New(iptables.Config{Config: cfg})
	},
	// Fails with an error matching proxier.ErrNotSupported on a kernel
	// without IPVS.
	"ipvs": func(cfg proxier.Config) (proxier.Proxier, error) {
		return ipvs.New(ipvs.Config{Config: cfg})
	},
}

// Names returns the names of the backends, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New returns the named backend's Proxier.
func New(name string, cfg proxier.Config) (proxier.Proxier, error) {
	c, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown backend %q (have: %s)", name, strings.Join(Names(), ", "))
	}
	return c(cfg)
}

// CleanupAll removes what every backend, with its default names, created in
// the namespace cfg names, except the backend named keep (empty: remove
// all). A backend this kernel cannot run is skipped: it cannot have left
// anything. Use it for --cleanup, and after switching a node to another
// backend (once the new one has synced, so service never stops).
func CleanupAll(ctx context.Context, cfg proxier.Config, keep string) error {
	cfg.NoConntrackCleanup = true
	cfg.NoServiceHealthChecks = true
	var errs []error
	// The eBPF backend's north-south rules live in an nftables table of
	// their own; its cgroup programs and pins are where its caller put
	// them, and its own Cleanup (with that Config) removes them.
	if keep != "ebpf" {
		if p, err := nftables.New(nftables.Config{Config: cfg, TableName: "proxykit-ebpf"}); err == nil {
			if err := p.Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("ebpf's nftables table: %w", err))
			}
			p.Close()
		} else if !errors.Is(err, proxier.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("ebpf's nftables table: %w", err))
		}
	}
	for _, name := range Names() {
		if name == keep {
			continue
		}
		p, err := New(name, cfg)
		if err != nil {
			if errors.Is(err, proxier.ErrNotSupported) {
				continue
			}
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if err := p.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		p.Close()
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
func RemoveLeftovers(ctx context.Context, cfg proxier.Config, keep string) error {
	lite := proxier.Config{NetNS: cfg.NetNS, Families: cfg.Families, Logger: cfg.Logger}
	return CleanupAll(ctx, lite, keep)
}
