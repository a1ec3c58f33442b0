package ebpf

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformanceTC runs the shared conformance suite with NorthSouth
// tc: the socket programs for the node and its pods, the tc programs
// (bpf/nodeport.c) for traffic from outside, and no netfilter rule:
// at the end of every case node1 holds no nftables table and no
// iptables rule (but in Coexistence, which adds foreign rules of its
// own). Every skip names what the tc datapath lacks.
func TestConformanceTC(t *testing.T) {
	f := factory(t, func(c *Config) { c.NorthSouth = NorthSouthTC })
	tcf := func(tb testing.TB, cfg proxier.Config) proxier.Proxier {
		p := f(tb, cfg)
		if !strings.Contains(tb.Name(), "Coexistence") {
			tb.Cleanup(func() { requireNoNetfilter(tb, cfg.NetNS) })
		}
		return p
	}
	proxiertest.Run(t, tcf, proxiertest.Options{Skip: bydesignSkips(tcSkips())})
}

// requireNoNetfilter fails tb if the namespace at path holds an
// nftables table or an iptables rule.
func requireNoNetfilter(tb testing.TB, path string) {
	tb.Helper()
	ns, err := netns.Open(path)
	if err != nil {
		tb.Errorf("open %s: %v", path, err)
		return
	}
	defer ns.Close()
	run := func(name string, args ...string) (string, error) {
		var out []byte
		err := ns.Do(func() error {
			var err error
			// Forked from this locked thread: in the namespace.
			out, err = exec.Command(name, args...).Output()
			return err
		})
		return string(out), err
	}
	if out, err := run("nft", "list", "ruleset"); err == nil && strings.TrimSpace(out) != "" {
		tb.Errorf("node1 holds nftables rules with NorthSouth tc:\n%s", out)
	}
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := run(cmd)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "-A ") {
				tb.Errorf("node1 holds an iptables rule with NorthSouth tc (%s): %s", cmd, l)
			}
		}
	}
}

// tcSkips are the cases the tc datapath cannot pass: none (SCTP, the
// last, is served since pk_tc_out serves the node's own packets).
func tcSkips() map[string]string {
	return map[string]string{}
}
