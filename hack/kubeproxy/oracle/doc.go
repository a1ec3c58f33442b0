// Command kube-proxy-oracle runs kube-proxy's own proxiers (pkg/proxy/nftables
// and pkg/proxy/iptables of the pinned k8s.io/kubernetes) without an API
// server, so that tests can program a network namespace exactly as kube-proxy
// would and compare traffic against proxykit. hack/kubeproxy/build.sh builds
// it; internal/kubeproxy starts and drives it.
//
// It works in the network namespace it is started in (nsenter --net=PATH,
// ip netns exec NAME, or a fork from a thread that entered one) and refuses
// to run in the namespace of PID 1. Commands arrive on stdin, one per line:
//
//	apply PATH   load Services, EndpointSlices and ServiceCIDRs from a YAML
//	             file (multi-document and/or kind: List), deliver them to the
//	             proxier as informer events (the first time as additions
//	             followed by the "synced" calls, later as the additions,
//	             updates and deletions relative to the previous file), sync,
//	             and answer "synced" once the rules are in the kernel, or
//	             "error: ..." if loading or syncing failed
//	quit         exit (so does the end of stdin); nothing is cleaned up
//
// Standard output carries only those answers; kube-proxy's log (klog) goes to
// standard error.
package main
