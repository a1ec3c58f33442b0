package kubeproxy_test

import "slices"

// difference is a known difference between kube-proxy and proxykit: every
// probe it matches must differ between the two, for every backend it
// names, and at least one must (the test fails otherwise, so the table
// stays true).
type difference struct {
	// id names the entry in failures.
	id string
	// backends are the compared backends it applies to.
	backends []string
	// match selects the scenario, phase and probe.
	match func(c *probeCase) bool
	// kubeProxy and proxykit say what each does.
	kubeProxy, proxykit string
	// status starts with "deliberate" or "to fix" and says why.
	status string
}

// differences lists every difference TestKubeProxyDifferential finds.
// Listed by running the test with no entries, grouping the DIFF lines of
// its log by scenario state, phase, client, destination and the two
// summaries, and writing one entry per cause; the test then checks that
// each entry matches exactly the differing probes.
var differences = []difference{
	{
		id:       "etp-itp-local-in-cluster-to-external",
		backends: allBackends,
		match: func(c *probeCase) bool {
			st := c.st
			if !st.etpLocal || !st.itpLocal || !inCluster(c.probe.client) || !hasRemoteServing(st.endpoints) {
				return false
			}
			if st.affinity && hasLocalServing(st.endpoints) {
				return false // sticky on both sides: nothing to see
			}
			switch c.probe.dest {
			case dNPInternal, dNPExternal, dExternalIP:
				return true
			case dLBIP:
				// With source ranges, pods and the node are not allowed
				// on either side; see lb-ranges-node-ipv6-leak.
				return st.ranges == rangesNone
			}
			return false
		},
		kubeProxy: "a pod, the hairpin pod or node1 connecting to a node port, external IP or load-balancer IP of a Service with " +
			"externalTrafficPolicy Local AND internalTrafficPolicy Local is short-circuited to the cluster-policy endpoints: " +
			"every serving endpoint, remote ones included (ready ones preferred over terminating ones); masqueraded as for the " +
			"cluster policy (hairpin to the remote pod keeps the pod's address)",
		proxykit: "the short-circuit uses the internal-policy endpoints, i.e. node-local only: only the local pod answers, " +
			"a terminating local pod is used instead of a ready remote one, and without a local endpoint the connection is dropped " +
			"(node1 to an LB IP over IPv6 with the iptables backends: rejected, the packet leaves via the uplink)",
		status: "to fix: kube-proxy (iptables and nftables) jumps to the cluster-policy chain for in-cluster traffic to " +
			"external destinations whatever internalTrafficPolicy says",
	},
	{
		id:       "nodeport-addresses-default-nftables",
		backends: []string{bNFT},
		match: func(c *probeCase) bool {
			return c.sc.defaults && c.probe.dest == dNPExternal
		},
		kubeProxy: "with no --nodeport-addresses, nftables mode serves node ports on the primary node IPs only " +
			"(\"primary\"): the port on node1's external address is refused",
		proxykit: "Config.NodePortAddresses empty means every local address: the node port answers on the external address",
		status: "deliberate: proxykit's documented default (kube-proxy iptables mode's default); callers wanting " +
			"kube-proxy nftables' behaviour pass the node IPs; candidate for review",
	},
}

// inCluster reports whether a client is inside the cluster (a pod or the
// node) rather than outside.
func inCluster(client string) bool { return client != cOutside }

// hasLocalServing reports whether an endpoint set has a serving endpoint
// on node1.
func hasLocalServing(eps string) bool {
	return slices.Contains([]string{epLocalRemote, epLocal, epTermLocalRemote, epAllTerm}, eps)
}

// hasRemoteServing reports whether an endpoint set has a serving endpoint
// on node2.
func hasRemoteServing(eps string) bool {
	return slices.Contains([]string{epLocalRemote, epRemote, epTermLocalRemote, epAllTerm, epRemoteTerm}, eps)
}
