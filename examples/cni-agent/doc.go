// Command cni-agent shows how an agent that already has its own view of
// the cluster (a CNI agent, say) embeds a proxykit Proxier: it delivers its
// own Service and EndpointSlice events by calling the Proxier's handlers,
// runs the Proxier inside a pod's network namespace, so that pod gets its
// own service proxy, and keeps an nftables table of its own (a small
// egress policy) beside proxykit's, without either disturbing the other.
//
//	sudo go run ./examples/cni-agent
//
// It builds a sandbox of network namespaces (package sandbox stands in
// for the pod networks a CNI plugin creates), prints each step and checks
// it with real traffic; it exits non-zero if a check fails. See README.md.
package main
