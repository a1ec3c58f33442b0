// Package proxiertest is the conformance suite of proxykit backends: the
// behaviours every service proxy must show, checked against the real
// kernel with real traffic. Every backend of this module runs it, and so
// can a third-party backend.
//
// # Running it
//
// A backend's test calls [Run] with a [Factory] that builds its proxier
// for the configuration the suite chooses:
//
//	func TestConformance(t *testing.T) {
//		proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
//			p, err := mybackend.New(mybackend.Config{Config: cfg})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return p
//		}, proxiertest.Options{
//			Skip: map[string]string{
//				"SessionAffinity-Timeout": "affinity timeouts are not implemented yet",
//			},
//		})
//	}
//
// and runs as root: sudo go test -run Conformance ./mybackend. Without root
// every case is skipped with a message saying so; with CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1 that is a failure instead. A few cases
// also need the nft, iptables(-save), ip6tables(-save) and ip programs;
// without them those cases skip (or fail under CI).
//
// # What a case does
//
// Each case runs as the subtests "<case>/IPv4" and "<case>/IPv6" (see
// [Cases] for the names; [Options] selects families and skips). It builds
// its own throwaway topology of network namespaces: node1, where the
// proxier runs, with three pods behind it; node2 with two pods (remote
// endpoints) and no proxier; a client outside the cluster; see
// internal/testnet for the addresses. The host's own network namespace is
// never touched. The case then
//
//  1. calls the Factory with a Config naming node1's namespace (NetNS),
//     NodeName "node1", the case's family, the pod networks as
//     ClusterCIDRs (10.244.0.0/16, fd00:10:244::/48) and short intervals
//     (MinSyncInterval 50ms, SyncPeriod 10s, RetryInterval 100ms), with a
//     Logger writing to the test log;
//  2. delivers node1's Node object (zone label zone-a, addresses), the
//     case's Services and EndpointSlices, and the three Synced calls, runs
//     the proxier (Run in a goroutine) and waits with Flush;
//  3. sends TCP, UDP or SCTP probes from the node, a pod or the client to
//     cluster IPs (10.96.0.0/24, fd00:10:96::/120), node ports, external
//     IPs and load-balancer IPs (203.0.113.0/24, 2001:db8:ff::/64) and
//     checks which pod answered, on which port, seeing which source
//     address, or that the probe was rejected at once or dropped;
//  4. changes objects through the update and delete handlers, waits with
//     Flush after each change, and probes again;
//  5. at the end stops the proxier (cancels Run's context and waits for
//     it), calls Cleanup and Close, and removes the topology, failing if
//     a socket or thread of the process is left in one of its namespaces.
//
// When a case fails, node1's nft rule set, iptables rules and conntrack
// table are written to the test log.
//
// The cases run in parallel (each has its own namespaces); the suite
// takes about half a minute on two cores with the default -parallel. Probes
// use short timeouts: an answer takes a millisecond, a drop is detected
// after one second.
//
// # Contracts the suite checks besides traffic
//
// Flush returns only after the dataplane matches every event delivered
// before it; Run returns nil once its context is done; Cleanup removes
// everything the backend created, also when called by a new instance that
// never ran; Close releases every handle (a netlink socket left open in
// the node namespace fails the case); another program's nftables table and
// iptables rules survive every sync and the cleanup; established
// connections survive a restart.
package proxiertest
