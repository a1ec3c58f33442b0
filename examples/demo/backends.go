package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/proxier"
)

// lister prints, short and readable, what a backend programmed in the
// node's namespace; name says which host owns an address.
type lister func(ctx context.Context, w io.Writer, node *testnet.Node, name func(netip.Addr) string) error

// backend is one dataplane the demo can run: every backend of the
// backends package, with the listings the demo knows for it.
type backend struct {
	name string
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
}

func (b backend) new(cfg proxier.Config) (proxier.Proxier, error) {
	return backends.New(b.name, cfg)
}

func backendNames() []string { return backends.Names() }

func lookupBackend(name string) (backend, error) {
	if !slices.Contains(backends.Names(), name) {
		return backend{}, fmt.Errorf("unknown backend %q (available: %s)", name, strings.Join(backends.Names(), ", "))
	}
	l := listers[name]
	return backend{name: name, show: l.show, raw: l.raw}, nil
}
