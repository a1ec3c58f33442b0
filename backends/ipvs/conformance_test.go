package ipvs_test

import (
	"testing"
	"time"

	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformance runs the shared conformance suite against the IPVS
// backend: real traffic through throwaway network namespaces. It needs a
// kernel with IPVS and the dummy driver; hack/vmtest.sh runs it in a VM
// where the host lacks them.
func TestConformance(t *testing.T) {
	ipvs.RequireIPVS(t)
	proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		p, err := ipvs.New(ipvs.Config{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, proxiertest.Options{
		// The suite runs in an emulated VM: probes spaced at 5ms leave
		// it the CPU to sync 5,000 services.
		RestartProbeInterval: 5 * time.Millisecond,
		Skip: map[string]string{
			// IPVS keeps a persistence template while any connection
			// it placed is still in its connection table, and counts
			// the timeout from the last one's end. A closed TCP
			// connection stays there in TIME_WAIT for 2 minutes (not
			// configurable: ipvsadm --set covers established, FIN_WAIT
			// and UDP only), so a client stays pinned for at least 2
			// minutes, whatever the service's timeout.
			// kube-proxy's ipvs mode does the same (its nftables and
			// iptables modes do not): docs/KUBE-PROXY-DIFFERENCES.md.
			"ExternalTrafficPolicyLocal-InClusterClientsReachAll": "as kube-proxy's ipvs mode: the virtual servers of a Local service's " +
				"external addresses hold the local endpoints only, for every client, so pods and the node reach no remote endpoint there",
			"BothPoliciesLocal-InClusterClientsReachAll": "as kube-proxy's ipvs mode: the virtual servers of a Local service's " +
				"external addresses hold the local endpoints only, for every client",
			"SessionAffinity-Timeout": "IPVS persistence lasts until the client's connections leave IPVS's table (TIME_WAIT: 2 minutes, fixed), so timeouts under 2 minutes are not honoured",
		},
	})
}
