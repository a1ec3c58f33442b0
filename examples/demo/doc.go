// Command demo shows proxykit at work without a cluster. It builds a
// sandbox of network namespaces on the machine (a node, pods running tiny
// TCP and UDP servers, a second node with more pods, an outside client),
// loads Services and EndpointSlices from a YAML file (a bundled one by
// default) with the static source, runs a proxier of the chosen backend
// in the node's namespace, sends real requests to every service from the
// node, a pod and the client, and prints which pods answered and which
// source address they saw. Then it shows what the backend programmed and
// tears the sandbox down, also on Ctrl-C.
//
//	sudo go run ./examples/demo                      # bundled services, nftables
//	sudo go run ./examples/demo --services my.yaml --watch
//
// It needs root (to create network namespaces) and a kernel with
// nf_tables; it needs no other program. The host's own network namespace
// is never touched: every address lives in the sandbox. See README.md.
package main
