// Package e2e holds proxykit's end-to-end tests: the real examples/proxy
// daemon against a real control plane, programming a real kernel.
//
// Each test starts etcd and kube-apiserver on loopback
// (internal/testcluster), builds a sandbox of network namespaces
// (internal/testnet: node1, node2, pods running servers, an outside
// client), applies the RBAC of examples/proxy/deploy/daemonset.yaml, and
// runs the daemon binary for one backend with a kubeconfig holding a token
// of the manifest's ServiceAccount (not an admin) and --netns pointing at
// node1's namespace, so it programs node1 and never the host. The test
// then writes Services, EndpointSlices, Node and load-balancer status
// through client-go as a cluster's controllers would (the API server
// allocates cluster IPs and node ports) and checks real traffic after
// every step; it measures network programming latency end to end, and
// stops the API server to check that the dataplane survives the outage
// and converges afterwards.
//
// The tests need root (network namespaces) and the control plane
// binaries that hack/testcluster/build.sh provides. Without them they
// skip, naming what is missing; with CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1 they fail instead. They run for the
// backends nftables and iptables when registered in backends.Names(), or
// for those listed, comma-separated, in PROXYKIT_E2E_BACKENDS. Run them
// alone with
//
//	sudo hack/testcluster/build.sh && sudo go test ./e2e/ -count=1 -v
//
// Lines starting with "E2E-LATENCY" in the verbose output report the
// measured latency per backend.
package e2e
