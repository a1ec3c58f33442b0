// Command proxy is a kube-proxy replacement built from proxykit: it
// watches Services, EndpointSlices and its own Node through client-go
// informers ([github.com/proxykit/proxykit/proxier/informer]) and programs
// them into the node's kernel with the chosen backend (any of
// [github.com/proxykit/proxykit/backends], with flags for their options:
// masquerade bit, scheduler, the eBPF backend's cgroup and pin path). It serves
// Prometheus metrics and kube-proxy's /healthz and /livez, and --cleanup
// removes everything any backend left on the node.
//
//	proxy --kubeconfig ~/.kube/config --hostname-override node1 --cluster-cidr 10.244.0.0/16
//
// In a cluster, deploy/daemonset.yaml runs it on every node (host network,
// privileged) with the RBAC it needs. See README.md.
package main
