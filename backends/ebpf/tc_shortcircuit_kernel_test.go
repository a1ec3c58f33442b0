package ebpf

import (
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCShortCircuit: with north-south at tc, an externalTrafficPolicy
// Local service sends the client (from outside) to its local endpoint
// only, and a pod of node1 to every endpoint (kube-proxy's short
// circuit), where the pod's packets reach tc untranslated: a
// load-balancer IP with source ranges (the socket programs pass pods'
// sockets to the packet path) and SCTP (which no socket program sees).
func TestTCShortCircuit(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		x := newTCFixture(t, f, false)
		all := x.localEps(8080, x.p11, x.p21)
		local := x.localEps(8080, x.p11)
		lb := extIP(f, 41)
		pod, client := x.pod3.IP(f), x.client.IP(f)
		ranged := svc("ranged", model.TCP, vip(f, 61), 80).WithTargets(all, local, true).With(func(sp *model.ServicePort) {
			sp.ExternalPolicy = model.PolicyLocal
			sp.LoadBalancerIPs = []netip.Addr{lb}
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(pod, pod.BitLen()), netip.PrefixFrom(client, client.BitLen())}
		})
		sctp := svc("sctp", model.SCTP, vip(f, 62), 80).WithTargets(all, local, true).With(func(sp *model.ServicePort) {
			sp.ExternalPolicy = model.PolicyLocal
			sp.NodePort = 30132
		})
		x.sync([]testSvc{ranged, sctp})

		d := ap(lb, 80)
		x.reaches(x.pod3, "tcp", d, 8080, 20, x.p11, x.p21)
		x.reaches(x.client, "tcp", d, 8080, 8, x.p11)

		np := ap(x.tn.Node1.IP(f), 30132)
		seen := map[string]int{}
		for range 20 {
			r := x.pod3.SCTPInit(np, 2*time.Second)
			if r.Outcome != testnet.Answered || r.Port != 8080 {
				t.Fatalf("pod3 -> %s/sctp: %v", np, r)
			}
			seen[r.Server]++
		}
		if seen[x.p11.Name] == 0 || seen[x.p21.Name] == 0 {
			t.Errorf("pod3 -> %s/sctp: 20 INITs reached %v, want both endpoints (the short circuit)", np, seen)
		}
		ext := ap(x.tn.Node1.ExternalIP(f), 30132)
		for range 8 {
			if r := x.client.SCTPInit(ext, 2*time.Second); r.Outcome != testnet.Answered || r.Server != x.p11.Name || r.Port != 8080 {
				t.Fatalf("client -> %s/sctp: %v, want %s (the local endpoint) on 8080", ext, r, x.p11.Name)
			}
		}
	})
}
