// Command proxykit-bench is proxykit's scale and comparison benchmark. In fresh
// network namespaces on this machine it measures, for every dataplane
// backend and for a series of service counts:
//
//   - the first full sync of a proxier process fed every Service and
//     EndpointSlice, and that process's peak resident set;
//   - the latency of one endpoint change, from the EndpointSlice event to
//     the sync that programmed it (median and p99);
//   - TCP connection setup through a cluster IP from a pod namespace to
//     real servers in other pod namespaces (median and p99);
//
// and the same for kube-proxy's nftables and iptables layouts generated at
// the same scale and loaded with `nft -f` and `iptables-restore`, as the
// reference in the same run. It writes BENCHMARKS.md, SVG plots and the
// raw results as JSON.
//
// Endpoints per service beyond 100 go into EndpointSlices of 100, as the
// EndpointSlice controller fills them; at such sizes the measured service
// has as many endpoints, all real (addresses its two server pods take as
// local). --large measures the big sizes of issue #22 into a report of
// its own; BENCHMARKS.md's section on them is written by hand from it.
//
// With --datapath it measures the data path instead (datapath.go, issue
// #21): a client namespace sends traffic to a node port of node1 whose
// endpoint is a pod behind node2, for each path (direct to the endpoint
// without a service, the proxykit backends, the eBPF backend's
// north-south options, kube-proxy's layouts) at 10 and 10,000 services
// (on the paths with direct server return, ebpf-tc-dsr and
// ebpf-xdp-dsr, the client has a link to node2 too, node2 runs an eBPF
// backend of its own that unwraps the flows, and the endpoint replies
// to the client over that link):
// short TCP connections per second (TCP_CRR, from a Go load generator
// to a tight server in the pod, with p50/p99 latency) and UDP packets per
// second at saturation (an AF_PACKET sender of pre-built frames; what
// reaches the endpoint and what node1 drops). A path whose backend
// option does not exist yet (an ebpf.Config field the backend lacks, a
// value its New refuses) is reported as not available; adding a path is
// a line in dpPaths. Its section of BENCHMARKS.md sits between the scale
// run's figures and the hand-written sections, and each mode keeps the
// other's.
//
// It is a Go module of its own (github.com/proxykit/proxykit/cmd/proxykit-bench,
// with the SDK replaced by ../..), so that the SDK's go.mod does not require
// its plotting library (gonum.org/v1/plot); a nested module of the same
// path prefix may still import the SDK's internal packages. `go run` from
// the repository's root cannot reach a nested module, so build it first,
// then run it from the root, where its default outputs are:
//
//	go build -C cmd/proxykit-bench -o /tmp/proxykit-bench .
//	sudo /tmp/proxykit-bench                 # the default run (< 15 min on 2 cores)
//	sudo /tmp/proxykit-bench --smoke         # 100 services, a few seconds
//	sudo /tmp/proxykit-bench --sizes 1000x10 --backends nftables --references ''
//	sudo /tmp/proxykit-bench --large          # 10x10000,1000x1000,100000x10 (issue #22), an hour
//	sudo /tmp/proxykit-bench --datapath      # data path, every path, 10 and 10,000 services (~20 min)
//	sudo /tmp/proxykit-bench --datapath --smoke  # direct and nftables at 10 services, a few seconds
//	/tmp/proxykit-bench --from docs/bench/results.json  # report and plots again, no measuring
//
// Its tests (`go test ./...` in this directory, as root; hack/test.sh runs
// them) make both smoke runs.
//
// Every measurement runs in a child process (this binary re-executed) in
// namespaces the parent built and tears down, also on Ctrl-C and on
// failure; the host's own network namespace is never touched.
package main
