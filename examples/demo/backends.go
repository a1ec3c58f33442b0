package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/sandbox"
)

// lister prints, short and readable, what a backend programmed in the
// node's namespace; name says which host owns an address.
type lister func(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error

// backend is one dataplane the demo can run: every backend of the
// backends package, and eBPF, with the listings the demo knows for each.
type backend struct {
	name string
	// start builds the proxier; release, when not nil, undoes what start
	// set up besides it, after the proxier is closed.
	start func(cfg proxier.Config, sb *sandbox.Sandbox) (p proxier.Proxier, release func() error, err error)
	// show prints the decoded summary; nil when the demo has none.
	show lister
	// raw prints the dataplane tool's own listing (--nft); may be nil.
	raw lister
}

// listers are the demo's listings per backend. A backend without an
// entry still runs; the demo then only says that it has no listing.
var listers = map[string]struct{ show, raw lister }{
	"nftables": {show: showNftables, raw: rawNftables},
	"iptables": {show: showIptables, raw: rawIptables},
	"ebpf":     {show: showEBPF, raw: rawNftTable("proxykit-ebpf")},
	"ipvs":     {show: showIPVS},
}

// ebpfName is the eBPF backend, which the backends package does not
// register: it needs a cgroup to attach to, which the demo makes (see
// newEBPF).
const ebpfName = "ebpf"

func backendNames() []string {
	names := append(backends.Names(), ebpfName)
	slices.Sort(names)
	return names
}

func lookupBackend(name string) (backend, error) {
	if !slices.Contains(backendNames(), name) {
		return backend{}, fmt.Errorf("unknown backend %q (available: %s)", name, strings.Join(backendNames(), ", "))
	}
	l := listers[name]
	b := backend{name: name, show: l.show, raw: l.raw}
	if name == ebpfName {
		b.start = newEBPF
	} else {
		b.start = func(cfg proxier.Config, _ *sandbox.Sandbox) (proxier.Proxier, func() error, error) {
			p, err := backends.New(name, cfg)
			return p, nil, err
		}
	}
	return b, nil
}
