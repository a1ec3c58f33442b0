// Command proxy is a kube-proxy replacement built from proxykit: it takes
// kube-proxy v1.36.3's configuration (a KubeProxyConfiguration file with
// --config, decoded, defaulted and validated as kube-proxy does), its
// flags (names, defaults and precedence: the file wins), its
// --write-config-to, --cleanup and --init-only, and serves its endpoints
// (the healthz server's /healthz with node eligibility and /livez; the
// metrics server's /metrics, /healthz, /proxyMode, /configz and, with
// --profiling, pprof). It watches Services, EndpointSlices and its own
// Node through client-go informers
// ([github.com/proxykit/proxykit/proxier/informer]), makes kube-proxy's
// node settings (conntrack and the mode's sysctls), and programs the
// node's kernel with the mode's backend
// ([github.com/proxykit/proxykit/backends]: iptables, ipvs, nftables, and
// proxykit's ebpf, whose options are --ebpf-* flags).
//
//	proxy --config /var/lib/kube-proxy/config.conf --hostname-override node1
//	proxy --proxy-mode nftables --kubeconfig ~/.kube/config --cluster-cidr 10.244.0.0/16
//
// In a cluster, deploy/daemonset.yaml runs it on every node (host network,
// privileged) with the RBAC it needs. README.md lists every flag and each
// difference from kube-proxy.
package main
