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
// The table holds a fixed number of sets and maps whatever the number of
// services: service addresses dispatch through one verdict map to a small
// chain per service port, whose one rule draws a random index with numgen
// and DNATs to the endpoint found at group . index in a shared endpoint map
// (64 shards). Session affinity uses dynamic maps with per-element
// timeouts, refreshed and replaced from the packet path. The kernel's cost
// of a transaction grows with the number of sets in a table and with the
// number of rules that look up the same map, so the backend bounds both;
// per-service state lives in elements.
// README.md describes the kernel contract: names, hooks, priorities, marks
// and key types.
//
// # Lifetimes and contracts
//
// A backend owns its table and nothing else: other tables of the namespace
// survive every sync and [proxier.Backend.Cleanup]. Every sync is one
// transaction; when the kernel rejects it, the previous rules stay in
// force. The first full sync of a process replaces the table's contents
// in the same transaction that deletes the old ones, so established
// connections (tracked by conntrack) survive a restart. Incremental syncs
// send only the difference for the changed service ports, computed from
// state kept in memory: they never read the kernel. A full sync re-asserts
// everything, and recreates the table if it was deleted behind the
// backend's back. Service ports the kernel cannot take are left out and
// reported as [*proxier.ObjectError]; the rest is programmed.
//
// Two backends, of the same or of different namespaces, can live in one
// process: the package has no global state.
package nftables
