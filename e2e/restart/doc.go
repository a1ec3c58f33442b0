// Package restart holds TestRestartAtScale: a proxier process is killed
// (SIGKILL) and a new one starts against the same static source, as a
// node's service proxy is restarted or upgraded, for the nftables,
// iptables and eBPF (with a pin path) backends, at scale.
//
// The test needs no API server: the proxier processes are the test binary
// re-executed in a child role (envChild), each building the backend with
// backends.New, feeding it the Services and EndpointSlices of one YAML
// file generated from internal/scale through proxier/static (with a cache
// directory: the first process parses the YAML and leaves the decoded
// objects there, the second reads them), and saying
// on standard output when its first sync succeeded. They program node1 of
// an internal/testnet topology; a pod of node1 keeps TCP connections open
// through services and opens ~50 new ones per second while the old process
// is killed and the new one starts. The test fails if a connection breaks
// or a new one fails, or if what the kernel holds after the restart (read
// back with backends.Inspect) is not what the services ask for; it reports
// the time from the new process's start to its first successful sync with
// t.Logf ("RESTART" lines).
//
// It runs 5,000 services of 10 endpoints by default (CI); set
// PROXYKIT_RESTART_SCALE to another number of services, e.g. 30000 for the
// figures of BENCHMARKS.md:
//
//	sudo PROXYKIT_RESTART_SCALE=30000 go test ./e2e/restart/ -count=1 -v -timeout 30m
//
// PROXYKIT_RESTART_CPUPROFILE=DIR makes each new process write a CPU
// profile of its start to DIR (restart-<backend>-<services>.cpu.pprof),
// to read with `go tool pprof` and the test binary (go test -c).
//
// PROXYKIT_RESTART_IPTABLES_MODE=legacy (or nft) sets the iptables
// backend's flavour, detected otherwise. After an adopting first sync of
// the nft flavour the test keeps probing until the backend has listed
// the adopted chains (which it does after the sync) and checks that the
// listing agreed with them.
//
// Without root it skips, unless CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1.
package restart
