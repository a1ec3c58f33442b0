// Package kubeproxy holds the differential test of proxykit against
// upstream kube-proxy. TestKubeProxyDifferential programs one sandbox (an
// internal/testnet topology) with kube-proxy's own proxier code, run by the
// oracle of internal/kubeproxy, and a twin sandbox with a proxykit backend,
// gives both the same Services and EndpointSlices, sends the same probes in
// both and compares, per probe: the outcome class (answered, rejected,
// dropped), the set of endpoint pods that answered (with ClientIP session
// affinity only whether the tries stuck to one pod) and the class of the
// source address the endpoint saw (the client's own, a node1 address, or
// another).
//
// # Comparisons
//
//   - proxykit nftables against kube-proxy's nftables mode;
//   - proxykit iptables, nft flavour, against kube-proxy's iptables mode;
//   - proxykit iptables, legacy flavour, against the same kube-proxy
//     iptables mode (which runs with iptables-nft; the behaviour is the
//     same).
//
// Both sides get node name node1, the topology's pod networks as cluster
// CIDRs and, outside the "nodeport-defaults" group, an explicit
// nodePortAddresses list of node1's addresses, and node1's primary
// addresses as node IPs (kube-proxy's --node-ips, proxykit's
// Config.NodeIPs).
// The nodeport-defaults group leaves nodePortAddresses to each side's
// default, a known candidate difference.
//
// # Scenarios
//
// The scenarios are generated from a matrix: service type (ClusterIP,
// NodePort, LoadBalancer with an ingress IP of ipMode VIP and an external
// IP), externalTrafficPolicy × internalTrafficPolicy, session affinity,
// loadBalancerSourceRanges (none, holding the outside client, holding
// nobody), endpoints (local and remote ready, remote only, local only,
// none, terminating local and ready remote, all terminating) and IP family,
// pruned by fixed rules (see generate). Each has a second phase that
// changes one thing (an endpoint, a policy). Probes go from a pod on node1,
// the local endpoint pod itself (hairpin), node1 and the outside client to
// the cluster IP, the node port on node1's primary and external addresses
// and on loopback (from node1), the external IP and the load-balancer IP,
// over TCP, and over UDP for a sample of them.
//
// Every scenario is a single-stack Service with its own cluster IP,
// external IP, load-balancer IP and node ports, so the scenarios of one IP
// family share one set of five sandboxes (one per side) without touching
// each other's rules; the groups run in parallel. Phase 2 starts from an
// empty connection tracking table on both sides, so it compares how new
// flows are handled (not which stale flows a proxier clears).
//
// # Differences
//
// Every difference that remains is listed, with its status ("deliberate"
// or "to fix"), in the differences table of the test: an unlisted
// difference fails the test, so does a listed one that no longer occurs,
// and so does a probe that a listed entry matches but where both sides
// agree. Answering sets that differ are probed again with more tries on
// both sides (a pod missed by chance shows up); the kube-proxy iptables
// side, shared by the two iptables comparisons, gets its tries once, and
// both comparisons then get them on their proxykit sides too. A difference that shows only in some tries of one side (an
// outcome class mixed with another) is probed afresh on both sides; if it
// goes away it is logged as FLAKE and counted in the summary line, not
// hidden.
//
// The package has no non-test code besides this documentation. The test
// needs root and the oracle binary (hack/kubeproxy/build.sh); without them
// it skips, or fails when CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1:
//
//	sudo hack/kubeproxy/build.sh && sudo go test ./e2e/kubeproxy/ -count=1 -v
//
// -short runs a sample of the matrix; PROXYKIT_KPDIFF_RUN=REGEXP runs the
// scenarios whose name or description match (both skip the check that
// every listed difference still occurs).
package kubeproxy
