package ebpf

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCNodeSCTP: with north-south at tc, the node's own SCTP packets
// to a cluster IP, which no socket program sees, are translated at the
// egress of the interface the node's route to it leaves by (pk_tc_out)
// and reach a local and a remote endpoint, whose neighbours node1 has
// not resolved yet (a packet that waited for the neighbour went out
// with the uplink's gateway as its destination before the route was
// replaced); no egress filter or link is left after Cleanup, and the
// node's packets then go unserved. Both attach paths run: tcx and
// clsact with cls_bpf.
func TestTCNodeSCTP(t *testing.T) {
	forAttachModes(t, testTCNodeSCTP)
}

func testTCNodeSCTP(t *testing.T, f model.IPFamily, legacy bool) {
	x := newTCFixture(t, f, legacy)
	both := x.localEps(8080, x.p11, x.p21)
	x.sync([]testSvc{svc("sctp", model.SCTP, vip(f, 64), 80).WithTargets(both, both, true)})
	d := ap(vip(f, 64), 80)
	seen := map[string]int{}
	for range 20 {
		r := x.node.SCTPInit(d, 2*time.Second)
		if r.Outcome != testnet.Answered || r.Port != 8080 {
			t.Fatalf("node -> %s/sctp: %v", d, r)
		}
		// Not SNATed (docs/KUBE-PROXY-DIFFERENCES.md): the source the
		// node's route toward the cluster IP gave, its uplink's.
		if up := x.tn.Node1.UplinkIP(f); r.Source.Addr().Unmap() != up {
			t.Errorf("node -> %s/sctp: %s saw source %s, want %s", d, r.Server, r.Source.Addr(), up)
		}
		seen[r.Server]++
	}
	if seen[x.p11.Name] == 0 || seen[x.p21.Name] == 0 {
		t.Errorf("node -> %s/sctp: 20 INITs reached %v, want both endpoints", d, seen)
	}
	clsact := x.plane().legacy // also without tcx in the kernel (6.1)
	if legacy && !clsact {
		t.Fatalf("attached with tcx, want clsact")
	}
	x.noNetfilter()
	// The names of the cls_bpf filters on uplink's egress (none
	// without a clsact qdisc), asked of the kernel.
	egress := func() string {
		nl := x.plane().nl
		l, err := nl.LinkByName("uplink")
		if err != nil {
			t.Fatalf("uplink: %v", err)
		}
		fs, _ := nl.FilterList(l, netlink.HANDLE_MIN_EGRESS)
		var names []string
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok {
				names = append(names, bf.Name)
			}
		}
		return strings.Join(names, " ")
	}
	if out := egress(); clsact && !strings.Contains(out, "pk_tc_out") {
		t.Errorf("clsact: uplink's egress holds filters %q, want pk_tc_out", out)
	}

	if err := x.b.Cleanup(context.Background()); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if out := egress(); strings.Contains(out, "pk_tc_") {
		t.Errorf("after Cleanup, uplink's egress holds filters %q", out)
	}
	if r := x.node.SCTPInit(d, 700*time.Millisecond); r.Outcome == testnet.Answered {
		t.Errorf("after Cleanup, node -> %s/sctp: %v, want no answer", d, r)
	}
}
