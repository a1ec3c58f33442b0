package proxiertest

// cases are the conformance cases, in the order they run. Names are
// stable: backends refer to them in Options.Skip. The topology is the one
// of internal/testnet: node1 (the proxier's namespace, zone-a) with pods
// node1-pod1..3, node2 with node2-pod1..2, and a client outside the
// cluster. Unless a case says otherwise node1-pod3 is the client pod and
// not an endpoint.
var cases = []testCase{
	// Cluster IPs: each protocol, from the node itself (output path) and
	// from a pod (forward path), to a local and a remote endpoint.
	{name: "ClusterIP-TCP-FromNode", run: clusterIPCase("tcp", false)},
	{name: "ClusterIP-TCP-FromPod", run: clusterIPCase("tcp", true)},
	{name: "ClusterIP-UDP-FromNode", run: clusterIPCase("udp", false)},
	{name: "ClusterIP-UDP-FromPod", run: clusterIPCase("udp", true)},
	// SCTP: a hand-built INIT chunk reaches an endpoint, DNATed, with the
	// right port and source. This checks delivery and NAT of SCTP
	// packets, not an SCTP association (the kernel under test may lack
	// SCTP sockets).
	{name: "ClusterIP-SCTPInitDelivery-FromNode", run: clusterIPCase("sctp", false)},
	{name: "ClusterIP-SCTPInitDelivery-FromPod", run: clusterIPCase("sctp", true)},
	{name: "MultiPort", run: multiPort},
	{name: "SamePortTwoProtocols", run: samePortTwoProtocols},
	{name: "ServiceAddedAndDeleted", run: serviceAddedAndDeleted},
	{name: "ServicePortChanged", run: servicePortChanged},
	{name: "Conflict-FirstOwnerKeepsAddress", run: conflictFirstOwnerKeeps},
	{name: "ServiceCIDR-UnallocatedDropped", needs: []string{"ip"}, run: serviceCIDRUnallocated},

	// Endpoints.
	{name: "LoadSpread", run: loadSpread},
	{name: "EndpointAdded", run: endpointAdded},
	{name: "EndpointRemoved", run: endpointRemoved},
	{name: "EndpointNotReady", run: endpointNotReady},
	{name: "EndpointTerminating", run: endpointTerminating},
	{name: "TerminatingFallback", run: terminatingFallback},
	{name: "NoEndpoints-Rejects", run: noEndpointsRejects},

	// External access.
	{name: "NodePort-FromClient", run: nodePortFromClient},
	{name: "NodePort-FromNode", run: nodePortFromNode},
	{name: "NodePort-FromPod", run: nodePortFromPod},
	{name: "NodePort-Localhost", run: nodePortLocalhost},
	{name: "NodePort-LoopbackAddressesSkipped", run: nodePortLoopbackAddresses},
	{name: "ExternalIP-FromClient", run: externalIPCase(fromClient)},
	{name: "ExternalIP-FromNode", run: externalIPCase(fromNode)},
	{name: "ExternalIP-FromPod", run: externalIPCase(fromPod)},
	{name: "LoadBalancerIP-FromClient", run: loadBalancerIPCase(fromClient)},
	{name: "LoadBalancerIP-FromPod", run: loadBalancerIPCase(fromPod)},
	{name: "LoadBalancerIP-ProxyModeIgnored", run: loadBalancerProxyMode},
	{name: "LoadBalancerSourceRanges-Allow", run: sourceRangesAllow},
	{name: "LoadBalancerSourceRanges-Deny", run: sourceRangesDeny},
	{name: "LoadBalancerSourceRanges-NodeTraffic", run: sourceRangesNode},

	// Traffic policies and masquerade.
	{name: "ExternalTrafficPolicyLocal-SourcePreserved", run: externalLocalSource},
	{name: "ExternalTrafficPolicyLocal-NoLocalEndpointsDrops", run: externalLocalDrops},
	{name: "ExternalTrafficPolicyLocal-InClusterClientsReachAll", run: externalLocalInCluster},
	{name: "BothPoliciesLocal-InClusterClientsReachAll", run: bothLocalInCluster},
	{name: "InternalTrafficPolicyLocal", run: internalLocalCase},
	{name: "InternalTrafficPolicyLocal-NoLocalEndpointsDrops", run: internalLocalDrops},
	{name: "Masquerade-ExternalToRemoteEndpoint", run: masqExternalToRemote},
	{name: "Masquerade-NodeToRemoteEndpoint", run: masqNodeToRemote},
	{name: "Masquerade-PodToServiceKeepsSource", run: masqPodKeepsSource},
	{name: "Masquerade-AllIsForClusterIPs", run: masqAllClusterIPsOnly},
	{name: "Hairpin", run: hairpin},

	// Session affinity.
	{name: "SessionAffinity-Sticks", run: affinitySticks},
	{name: "SessionAffinity-Timeout", run: affinityTimeout},
	{name: "SessionAffinity-TurnedOff", run: affinityTurnedOff},

	// Connection tracking.
	{name: "UDP-StaleConntrackAfterEndpointChange", run: udpStaleConntrack},
	{name: "TCP-ConnectBeforeService", run: tcpConnectBeforeService},

	// Topology.
	{name: "Topology-ZoneHints", run: topologyZoneHints},
	{name: "Topology-NodeHints", run: topologyNodeHints},
	{name: "Topology-PreferSameZone", run: topologyPreferSameZone},
	{name: "Topology-IncompleteHintsIgnored", run: topologyIncompleteHints},
	{name: "Topology-NoHintForZone", run: topologyNoHintForZone},

	// Lifecycle.
	{name: "Coexistence", needs: []string{"nft", "iptables", "iptables-save", "ip6tables", "ip6tables-save"}, run: coexistence},
	{name: "Restart-EstablishedTCPSurvives", run: restart},
	{name: "Restart-NewConnectionsSurvive", run: restartNewConnections},
	{name: "Cleanup-RemovesEverything", needs: []string{"nft", "ip"}, run: cleanupRemovesEverything},
	{name: "Cleanup-ByNewInstance", needs: []string{"nft", "ip"}, run: cleanupByNewInstance},
	{name: "Cleanup-OnCleanNamespace", needs: []string{"nft", "ip"}, run: cleanupOnCleanNamespace},

	// Both families in one proxier.
	{name: "DualStack", dual: true, run: dualStack},
}
