// Package testcluster runs a real Kubernetes control plane on loopback for
// end-to-end tests, the way controller-runtime's envtest does: an etcd and
// a kube-apiserver as child processes of the test, reachable only on
// 127.0.0.1, with their data, certificates and logs in temporary
// directories.
//
// [Start] brings one up for a test and stops it in t.Cleanup. The API
// server authenticates an admin (a static token in group system:masters,
// used by the test driver through [Cluster.Client]) and service accounts
// (bound tokens from the TokenRequest API, signed by a key generated per
// cluster), and authorizes with RBAC. [Cluster.ServiceAccountKubeconfig]
// writes a kubeconfig holding such a token, so a program under test runs
// with exactly the rights its RBAC grants, not as admin; [ApplyRBAC]
// creates the ServiceAccounts, (Cluster)Roles and bindings of a manifest.
// [Cluster.StopAPIServer] and [Cluster.StartAPIServer] simulate an API
// outage: etcd keeps the state and the server comes back on the same
// address.
//
// No controller manager, scheduler or kubelet runs: the API server
// allocates cluster IPs and node ports, but nothing creates
// EndpointSlices for selectors or fills in load-balancer status; the test
// writes those itself.
//
// # Binaries
//
// etcd comes from Debian's etcd-server package and kube-apiserver is
// built from the pinned k8s.io/kubernetes module; hack/testcluster/build.sh
// provides both (see [FindBinaries] for where they are looked for and the
// environment variables that override it). Without them [Start] skips the
// test with a message naming the script, or fails it when CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1 is set. Neither the control plane nor this
// package needs root; the network namespaces of an end-to-end test do.
//
// Like internal/testnet, this package is test support: unlike library code
// it reads environment variables (in [FindBinaries] and [Start] only).
package testcluster
