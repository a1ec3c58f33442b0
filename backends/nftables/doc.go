// Package nftables is the nftables backend of proxykit: it programs
// Kubernetes services into one nf_tables table per IP family ("ip proxykit"
// and "ip6 proxykit" by default) of a network namespace, over netlink,
// without the nft binary.
//
// [New] returns a [proxier.Proxier]; [NewBackend] returns the bare
// [proxier.Backend] of one family, for callers that drive it directly.
//
// # Layout
//
// The table holds a bounded number of sets, maps and shared chains
// whatever the number of services: eleven fixed sets, and per shard (at
// most 256) an endpoint map (split into up to 4 parts past 10,240 service
// ports), an affinity set and three shared chains,
// created when a service port first uses them and deleted when the last
// one stops, so that a node with a few services lists a few hundred lines.
// A family without service ports or service ranges has no table. Service addresses and
// node ports dispatch through verdict maps to the shared chain of their
// shard, whose rule (one per part in use) draws a random position and
// looks up the packet's own destination (daddr . proto . dport; hashed for
// IPv6) plus that position in an interval map of endpoint ranges: the
// endpoint whose range
// holds the position is the DNAT target. No rule depends on a service's
// endpoints, and most service ports have no chain of their own, so adding
// or removing an endpoint changes map elements only and costs the same at
// 10,000 services as at 100. Session affinity, external traffic policy
// Local and hash collisions use a chain per service port; affinity is
// recorded in dynamic sets keyed by endpoint id and client, and every rule
// can be printed by `nft list ruleset`. The kernel's cost of a transaction
// grows with the number of chains (it walks them all at commit), the
// number of sets, and the size of a changed interval map, so the backend
// bounds all three.
// README.md describes the kernel contract: names, hooks, priorities, marks
// and key types.
//
// # Lifetimes and contracts
//
// A backend owns its table and nothing else: other tables of the namespace
// survive every sync and [proxier.Backend.Cleanup]. Every sync is one
// transaction; when the kernel rejects it, the previous rules stay in
// force. No sync deletes a table that exists: a full sync flushes its
// chains and sets and fills them again in one transaction, and the first
// full sync of a process takes over a table an earlier process left the
// same way (chains no service port needs are deleted), so that neither
// new nor established connections fail across a restart; when the table
// already holds exactly what that sync would write, as a fingerprint
// chain recorded by the last full sync says, it is adopted instead and
// nothing is written (README.md says what is trusted). Only a table the
// kernel refuses to take over in place (an earlier version's, with other
// set definitions) is deleted and created again, in the transaction that
// fills it. Incremental syncs
// send only the difference for the changed service ports, computed from
// state kept in memory: they never read the kernel. A full sync re-asserts
// everything, and recreates the table if it was deleted behind the
// backend's back. Service ports the kernel cannot take are left out and
// reported as [*proxier.ObjectError]; the rest is programmed.
//
// Two backends, of the same or of different namespaces, can live in one
// process: the package has no global state.
package nftables
