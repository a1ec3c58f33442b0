package ebpf

import (
	"strings"
	"testing"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformanceXDP runs the shared conformance suite with NorthSouth
// xdp: the XDP program (bpf/xdp.c) on node1's external interfaces in
// front of the tc programs, and no netfilter rule (checked as in
// TestConformanceTC). The far ends of node1's veths stand for the wire
// (wireLikePeers), so XDP translates and redirects what it can; its
// skips are the tc datapath's, whose limits it shares.
func TestConformanceXDP(t *testing.T) {
	f := factory(t, func(c *Config) {
		c.NorthSouth = NorthSouthXDP
		c.NorthSouthXDPVeth = true
	})
	xf := func(tb testing.TB, cfg proxier.Config) proxier.Proxier {
		wireLikePeers(tb, cfg.NetNS)
		p := f(tb, cfg)
		if !strings.Contains(tb.Name(), "Coexistence") {
			tb.Cleanup(func() { requireNoNetfilter(tb, cfg.NetNS) })
		}
		return p
	}
	proxiertest.Run(t, xf, proxiertest.Options{Skip: bydesignSkips(tcSkips())})
}
