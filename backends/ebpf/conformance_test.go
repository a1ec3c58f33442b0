package ebpf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformance runs the shared conformance suite against the eBPF
// backend with the nftables rules composed.
//
// The suite's clients and servers are threads of this test process, so
// the process moves into a cgroup of the test's own for the run (see
// newCgroup), and every case's proxier attaches its programs
// there. A proxier translates the sockets of its node namespace and of
// that node's pods only: the client namespace is outside the cluster and
// reaches services through node1's nftables rules, as a real client
// would; other cases' namespaces are not its own. Each case pins under a
// directory of its own on a bpffs of the test's own, so that its second
// proxier (restart and cleanup cases) adopts the first one's programs
// and maps.
//
// Covered natively (socket programs): cluster IP TCP and UDP from the
// node and from pods, multiple ports and protocols, endpoint changes,
// terminating fallback, no-endpoint rejects of TCP, session affinity
// and internal traffic policy from the node and pods, topology, hairpin
// (a pod translated to itself), node ports, external and load-balancer
// IPs from the node and pods. Through the composed nftables rules:
// everything from the client (node ports, external and load-balancer
// IPs, source ranges, external traffic policy, masquerade of external
// traffic), SCTP (hand-built INITs on raw sockets, which the socket
// hooks do not see), UDP to a service without endpoints (connect goes
// through untranslated; nftables rejects the datagrams), and the UDP
// stale-conntrack case, whose socket connects before the service has
// an endpoint and so stays on the service address.
func TestConformance(t *testing.T) {
	proxiertest.Run(t, factory(t, nil), proxiertest.Options{Skip: bydesignSkips(nil), ServiceCIDRs: true})
}

// bydesignSkips adds to skip the cases whose kube-proxy behaviour the
// socket programs differ from on purpose (docs/KUBE-PROXY-DIFFERENCES.md).
func bydesignSkips(skip map[string]string) map[string]string {
	if skip == nil {
		skip = map[string]string{}
	}
	skip["Masquerade-AllIsForClusterIPs"] = "by design: the socket programs connect pods and the node straight to the endpoint, " +
		"so cluster IP traffic is never NATed and masqueradeAll has nothing to masquerade"
	return skip
}

// TestConformanceSocketOnly runs the suite with SocketOnly set: no
// nftables rule, the socket programs alone. What passes here is covered
// natively; the skips are what this part leaves to the composed nftables
// rules.
func TestConformanceSocketOnly(t *testing.T) {
	proxiertest.Run(t, factory(t, func(c *Config) { c.SocketOnly = true }), proxiertest.Options{Skip: bydesignSkips(socketOnlySkips()), NodeOnly: true})
}

// TestConformanceMaglev runs the suite with Maglev selection, on the
// socket programs alone (SocketOnly, the skips of
// TestConformanceSocketOnly): the selection is theirs, and the composed
// nftables rules, which TestConformance covers, do not change with it.
// Running the composed suite a second time would add about a minute to
// the test run for nothing new.
func TestConformanceMaglev(t *testing.T) {
	proxiertest.Run(t, factory(t, func(c *Config) {
		c.SocketOnly = true
		c.Scheduler = proxier.SchedulerMaglev
		c.MaxMaglevTables = 256
	}), proxiertest.Options{Skip: bydesignSkips(socketOnlySkips()), NodeOnly: true})
}

// socketOnlySkips are the cases the socket programs alone leave to the
// composed nftables rules.
func socketOnlySkips() map[string]string {
	const fromClient = "the client is outside the cluster: its traffic reaches node ports, external and load-balancer IPs as packets, which only the composed nftables rules handle in this part"
	skip := map[string]string{
		"ClusterIP-SCTPInitDelivery-FromNode": "SCTP is left to the nftables rules (the probe uses raw sockets, which the socket hooks do not see)",
		"ClusterIP-SCTPInitDelivery-FromPod":  "SCTP is left to the nftables rules (the probe uses raw sockets, which the socket hooks do not see)",
		"UDP-StaleConntrackAfterEndpointChange": "without the nftables rules, connect of a UDP socket to a service without endpoints fails with ECONNREFUSED " +
			"(the case keeps a socket from before the first endpoint); and the case also probes from the client",
		"TCP-ConnectBeforeService": "the socket hooks translate at connect(): a socket that connected before the service existed keeps " +
			"retransmitting its SYN to the service address, which only the composed nftables rules translate",
	}
	for _, c := range []string{
		"NodePort-FromClient", "ExternalIP-FromClient", "LoadBalancerIP-FromClient", "LoadBalancerIP-ProxyModeIgnored",
		"LoadBalancerSourceRanges-Allow", "LoadBalancerSourceRanges-Deny", "LoadBalancerSourceRanges-NodeTraffic",
		"ExternalTrafficPolicyLocal-SourcePreserved", "ExternalTrafficPolicyLocal-NoLocalEndpointsDrops",
		"InternalTrafficPolicyLocal", "InternalTrafficPolicyLocal-NoLocalEndpointsDrops",
		"Masquerade-ExternalToRemoteEndpoint", "SessionAffinity-Sticks", "Coexistence",
		"Cleanup-RemovesEverything", "Cleanup-ByNewInstance", "DualStack",
	} {
		skip[c] = fromClient
	}
	return skip
}

// factory returns the suite's factory; mod (if not nil) changes the
// configuration. It moves the test process into a cgroup of the test's
// own for the run (see newCgroup) and mounts a bpffs of its own.
func factory(t *testing.T, mod func(*Config)) proxiertest.Factory {
	testnet.RequireRoot(t)
	cg := newCgroup(t)
	pins := bpffs(t)
	return func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		// Translate in node1 and its pods, not in the outside client.
		pods := proxiertest.PodNamespaces(t)
		if len(pods) == 0 {
			t.Fatalf("the suite named no pod namespaces for %s", t.Name())
		}
		pin := filepath.Join(pins, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(pin, 0o700); err != nil {
			t.Fatal(err)
		}
		c := Config{
			Config:      cfg,
			CgroupPath:  cg,
			PinPath:     pin,
			PodNetNS:    pods,
			MaxServices: 8192,
			MaxBackends: 8192,
			MaxAffinity: 4096,
			MaxSockets:  4096,
		}
		if mod != nil {
			mod(&c)
		}
		p, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}
