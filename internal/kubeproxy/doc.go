// Package kubeproxy runs upstream kube-proxy as an oracle for real-kernel
// tests: the proxiers of the pinned k8s.io/kubernetes (pkg/proxy/nftables
// and pkg/proxy/iptables, the very code kube-proxy runs) program a network
// namespace, and a test compares the traffic there with what proxykit does
// for the same Services and EndpointSlices.
//
// # The oracle program
//
// hack/kubeproxy/build.sh builds kube-proxy-oracle from its own module,
// hack/kubeproxy/oracle, into a cache directory outside the repository, as
// hack/testcluster/build.sh builds kube-apiserver; this package never
// imports k8s.io/kubernetes. [Binary] finds it by the same rules as
// internal/testcluster finds kube-apiserver and, like it, does not build
// it: without the binary [RequireBinary] and [New] skip the test with a
// message naming the script (or fail it when CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1).
//
// The oracle works in the network namespace it is started in and refuses
// to start in the host's. It takes kube-proxy's flags (see [Options]) and
// reads commands on its standard input, one per line; its standard output
// carries only the answers, its standard error kube-proxy's log:
//
//	apply PATH  ->  "synced" | "error: ..."
//	quit        (or the end of stdin) exits; nothing is cleaned up
//
// PATH is a YAML file of core/v1 Services, discovery.k8s.io/v1
// EndpointSlices and networking.k8s.io/v1 ServiceCIDRs (several documents
// and/or kind: List; other kinds are skipped; unknown fields are errors).
// The objects get the API server's scheme defaults and the namespace
// "default" when they have none, but nothing the API server's registry
// would add (cluster IPs, node ports, IP families): write those as the
// API server would store them. The oracle filters them as kube-proxy's
// informers do (no headless Services, none labelled
// service.kubernetes.io/service-proxy-name, no EndpointSlices labelled
// service.kubernetes.io/headless). The first apply delivers every object
// as an addition and then the "synced" calls; each later apply delivers
// the additions, updates and deletions (by namespace/name) relative to the
// previous file. Each apply then runs one synchronous sync per IP family
// and answers "synced" only after every family's transaction (nft -f,
// iptables-restore) has succeeded.
//
// # Differences from a kube-proxy process
//
// The proxier's SyncLoop does not run: the oracle syncs exactly once per
// apply instead of when kube-proxy's rate-limited runner would, there are
// no periodic resyncs and no retries after a failed sync (the next apply
// retries, with a full sync). kube-proxy runs dual-stack whenever the host
// supports both families; the oracle runs single-stack when given a node
// IP of one family only. Of kube-proxy's conntrack sysctls only the
// per-namespace TCP timeouts are set (nf_conntrack_max and the hash size
// are host-wide). No healthz or metrics server listens (the per-Service
// health check servers of externalTrafficPolicy: Local Services do, in
// the namespace), no events are sent, and stale rules of the other mode
// are not cleaned up at start.
package kubeproxy
