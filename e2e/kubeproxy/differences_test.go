package kubeproxy_test

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
