// Package iptables is the iptables backend of proxykit: it programs
// Kubernetes services into the nat and filter tables of a network
// namespace by feeding iptables-restore --noflush (ip6tables-restore for
// IPv6), in the flavour the namespace already uses, legacy or nft.
//
// [New] returns a [proxier.Proxier]; [NewBackend] returns the bare
// [proxier.Backend] of one family, for callers that drive it directly.
//
// # Layout
//
// The chains follow kube-proxy's iptables mode under a prefix of our own
// (PROXYKIT by default, [Config.ChainPrefix]), so the backend can run
// beside a kube-proxy: a dispatch chain matches each service address and
// port and jumps to a chain per service port, which picks one endpoint
// chain with "-m statistic --mode random" and DNATs there; "-m recent"
// pins clients for session affinity; a mark bit asks a postrouting chain
// to masquerade; the filter table rejects traffic to services without
// endpoints and drops what load-balancer source ranges and Local traffic
// policies do not allow. Chain names carry a hash of the service port
// (and endpoint), as kube-proxy's do. README.md is the kernel contract:
// tables, chains, hooks, marks and versions.
//
// # Lifetimes and contracts
//
// The backend owns the chains carrying its prefix and the rules in the
// built-in chains that jump to them, and nothing else: other programs'
// rules in the same tables and built-in chains survive every sync and
// [proxier.Backend.Cleanup]. The jumps are inserted once, when missing,
// and kept.
//
// A complete rewrite (the first sync of a process, any sync after a
// failure, and a full request once per [Config.RewriteInterval]) writes
// every chain of ours in one restore run and deletes those no longer
// needed, whatever an earlier process left; the first sync of a process
// instead adopts our chains, writing nothing, when a fingerprint rule the
// last rewrite left says they hold what it would write (README.md says
// what is trusted). A rewrite flushes that rule in its first commit and
// writes the new one in its last, so a process killed in between leaves
// none. The nft flavour adopts on the fingerprint and the
// jumps alone and lists our chains after the sync, beside the following
// syncs, because the kernel's chain dump is quadratic in the chains
// (7-23 s at 30,000 services of 10 endpoints): a left-over or missing
// chain of ours found then, and confirmed by name, makes the next sync
// list them again and rewrite
// everything, and so does a listing that failed. Until then a left-over
// chain carries no traffic (nothing of ours jumps to it), and a missing
// chain's service ports stay as broken as the restart found them
// (TestKernelChecksAdoptedChains). The legacy flavour reads the tables
// with iptables-legacy-save, which lists the chains anyway, and checks
// them before adopting. A partial sync rewrites only
// the chains of the changed service ports and adds or deletes their rules
// in the shared dispatch chains, computed from state kept in memory: its
// input grows with the change, not with the number of services. A full
// request between rewrites compares every service port with that state
// and checks the jumps from the built-in chains, in the same single run
// (the nft flavour reads them first with iptables -S of the built-in
// chains, whose -C fetches every rule of the chain jumped to).
// Every partial input first deletes and re-adds the one rule of a canary
// chain in each table it writes; when that fails, someone flushed our
// chains (a firewall reload), and the backend rewrites everything at once.
//
// iptables-restore commits each table atomically, so a failed run leaves
// the failing table as it was. When the program names a line written for
// a service port, that port keeps its previous rules (or is left out),
// the run is repeated without it, and the sync reports a
// [*proxier.ObjectError] for it; any other failure fails the sync and the
// next one rewrites everything. Established connections survive a restart: the new
// process rewrites the chains in place and conntrack keeps its entries.
//
// Programs run on a locked OS thread inside the configured namespace: one
// iptables-restore per sync, none when nothing changed (and iptables -C
// and -I when a jump from a built-in chain is missing); a complete rewrite
// in the nft flavour runs one per about 30,000 chains, whose sections
// commit one after the other anyway.
// Two backends, of the same or of different namespaces, can live in one
// process: the package has no global state.
package iptables
