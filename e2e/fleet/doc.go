// Package fleet holds TestFleet: many nodes on one API server, issue #22's
// stand-in for a large cluster.
//
// One kube-apiserver and etcd run on loopback (internal/testcluster). Each
// of N nodes is an internal/testnet topology of its own (its node1
// namespace, one pod behind it and one behind node2; every topology has
// the same private and documentation addresses, in namespaces of its own,
// not linked to each other) and a proxier process: the test binary
// re-executed in a child role, running the nftables backend on that node
// namespace, fed by proxier/informer with the daemon's client defaults
// (protobuf, QPS 5, burst 10) and the ServiceAccount of examples/proxy's
// manifest, as a DaemonSet pod does. Separate processes make each
// proxier's resident memory its own.
//
// One deliberate difference from a daemon's defaults: the proxiers'
// conntrack cleanup after each sync is off (proxier.Config.
// NoConntrackCleanup; PROXYKIT_FLEET_CONNTRACK_CLEANUP=1 keeps it). The
// Services are TCP, so it would only delete untranslated SYNs to newly
// programmed ports, but each time it dumps the conntrack table, and a
// dump in one namespace walks the whole table of the kernel, every node
// namespace's entries and those of anything else running on the machine.
// On a real cluster each node has a kernel of its own; here that cost
// grows with N per proxier (a profile of one proxier found 72-83 % of its
// CPU time there, with ~100,000 entries of other work in the table).
//
// The test creates S ClusterIP Services with one EndpointSlice each (one
// endpoint, on node1-pod1 or node2-pod1). It starts the proxiers one after
// another over 30 s, the proxiers' full resync period, so that their
// periodic full resyncs are spread as independent nodes' are (with
// PROXYKIT_FLEET_STAGGER=0 they start at once, as after a cluster-wide
// restart, and resync together on the machine's few CPUs), and waits
// until each answers a sample of them. Then it writes R times per second
// for a while: every fifth write moves a Service's port (80 <-> 81), the
// others move an EndpointSlice's endpoint to the other pod.
//
// Every write is probed on every node: a TCP connection from the node
// namespace to the Service's cluster IP and port, which counts once the
// write's pod answers. The network programming latency of a (write, node)
// pair is the time from just before the API request to that answer. A
// node's pending writes that its proxier has received are probed whenever
// the kernel announces a new nf_tables generation in its namespace (a
// committed transaction, seen on the NFNLGRP_NFTABLES multicast group; a
// sync that programs a write commits one) and every second besides.
// Probes run on one thread per node that stays in the node namespace, and
// end their connection with a reset, so a conntrack entry lasts 10 s, not
// TIME_WAIT's 120 s. Each proxier writes on its standard output the time
// it received every update (the API server's watch delivery) and the end
// and duration of every sync (the engine's "synced" log record), which
// gives the proxier's own view beside the probes': from the write to the
// end of the first sync that began after delivery.
//
// The test logs, on lines starting with FLEET: the programming latency over
// all (write, node) pairs, and of the fastest and slowest node per write;
// the proxiers' own view and their sync durations; the watch delivery and
// the API write time; each proxier's first sync from its start; the
// kube-apiserver's and etcd's CPU time over the churn (utime + stime from
// /proc/PID/stat) and the API server's VmRSS; its open watches
// (apiserver_longrunning_requests{verb="WATCH"}; kube-apiserver 1.36 has no
// apiserver_registered_watchers) and the Service and EndpointSlice watch
// events it sent; each proxier's CPU time, VmRSS (median of samples every
// 5 s over the churn) and VmHWM; and the test process's own CPU time, as
// it shares the machine with what it measures. It fails if a write is not
// programmed on every node within 30 s, if an API write fails or if a
// proxier exits.
//
// It is an opt-in measurement, not part of `go test ./...` or CI: it runs
// N processes and takes minutes, so it skips unless PROXYKIT_FLEET_NODES
// is set. PROXYKIT_FLEET_SERVICES (default 1000), PROXYKIT_FLEET_RATE
// (writes per second, default 10), PROXYKIT_FLEET_CHURN (default 2m) and
// PROXYKIT_FLEET_MIN_SYNC (the proxiers' minimum sync interval, default 1s
// as kube-proxy's) change the other sizes; PROXYKIT_FLEET_PROFILE=DIR
// makes the first node's proxier write its CPU profile there, and
// PROXYKIT_FLEET_CSV=FILE writes every (write, node) pair's figures to a
// file. It needs root and the control plane binaries of
// hack/testcluster/build.sh. The figures of BENCHMARKS.md came from, as
// root:
//
//	PROXYKIT_FLEET_NODES=10 go test ./e2e/fleet/ -run TestFleet -count=1 -v -timeout 30m
//	PROXYKIT_FLEET_NODES=50 go test ./e2e/fleet/ -run TestFleet -count=1 -v -timeout 30m
//
// (and the same with PROXYKIT_FLEET_NODES=25, and with
// PROXYKIT_FLEET_MIN_SYNC=100ms).
package fleet
