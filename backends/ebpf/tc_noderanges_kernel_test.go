package ebpf

import (
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCNodeOnlyRanges: with north-south at tc, a load-balancer
// IP with source ranges is checked for the node's own sockets by the
// source of the node's route toward it, while a pod's socket passes the
// socket programs untranslated and meets the ranges at its veth's tc
// program with its own address. Ranges holding only a pod of node1:
// the node is dropped (EPERM at connect), the pod reaches the
// endpoints. Ranges holding only node1's uplink (its route source):
// the node reaches them, the pod is dropped. (The node's decision with
// tc and XDP is conformance's LoadBalancerSourceRanges-NodeTraffic.)
func TestTCNodeOnlyRanges(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newTCFixture(t, f, false)
		both := x.localEps(8080, x.p11, x.p21)
		lb := extIP(f, 40)
		d := ap(lb, 80)
		ranged := func(r netip.Prefix) []testSvc {
			s := svc("ranged", model.TCP, vip(f, 60), 80).WithTargets(both, both, true)
			s.Port.LoadBalancerIPs = []netip.Addr{lb}
			s.Port.LoadBalancerSourceRanges = []netip.Prefix{r}
			return []testSvc{s}
		}
		silent := func(h *testnet.Host) {
			t.Helper()
			if r := h.TCP(d, 700*time.Millisecond); !r.Outcome.Silent() {
				t.Errorf("%s -> %s: %v, want a drop", h.Name, d, r)
			}
		}
		pod := x.pod3.IP(f)
		x.sync(ranged(netip.PrefixFrom(pod, pod.BitLen())))
		silent(x.node)
		x.reaches(x.pod3, "tcp", d, 8080, 20, x.p11, x.p21)

		up := x.tn.Node1.UplinkIP(f)
		next := ranged(netip.PrefixFrom(up, up.BitLen()))
		x.sync(next, next[0].Port.Name) // an incremental sync decides again
		x.reaches(x.node, "tcp", d, 8080, 20, x.p11, x.p21)
		silent(x.pod3)
	})
}
