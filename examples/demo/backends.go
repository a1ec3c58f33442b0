package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/sandbox"
)

// lister prints, short and readable, what a backend programmed in the
// node's namespace; name says which host owns an address.
type lister func(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error

// backend is one dataplane the demo can run: every backend of the
// backends package, with the listings the demo knows for each.
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
	"ebpf":     {show: showEBPF, raw: rawNftTable(ebpf.DefaultTableName)},
	"ipvs":     {show: showIPVS},
}

func lookupBackend(name string) (backend, error) {
	if !slices.Contains(backends.Names(), name) {
		return backend{}, fmt.Errorf("unknown backend %q (available: %s)", name, strings.Join(backends.Names(), ", "))
	}
	l := listers[name]
	return backend{name: name, show: l.show, raw: l.raw}, nil
}

// start builds the backend's proxier for the sandbox through the
// registry. release, when not nil, undoes what start set up besides the
// proxier; call it after the proxier is closed.
//
// The eBPF backend's socket programs translate the sockets of processes
// in a cgroup; the demo's probes and servers are goroutines of this
// process, so for it the demo creates a cgroup v2 of its own, moves
// itself into it and attaches there: no other process of the machine is
// affected. Its pods' namespaces get the socket programs too.
func (b backend) start(cfg proxier.Config, sb *sandbox.Sandbox) (p proxier.Proxier, release func() error, err error) {
	bc := backends.Config{Config: cfg}
	if b.name == "ebpf" {
		cg, err := sandbox.EnterCgroup("proxykit-demo-")
		if err != nil {
			return nil, nil, fmt.Errorf("a cgroup v2 for the socket programs: %w", err)
		}
		release = cg.Leave
		bc.EBPF.CgroupPath = cg.Path()
		for _, pod := range sb.Node1.Pods {
			bc.EBPF.PodNetNS = append(bc.EBPF.PodNetNS, pod.NetNSPath())
		}
	}
	p, err = backends.New(b.name, bc)
	if err != nil {
		if release != nil {
			err = errors.Join(err, release())
		}
		return nil, nil, err
	}
	return p, release, nil
}
