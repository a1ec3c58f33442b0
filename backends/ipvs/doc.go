// Package ipvs is the IPVS backend of proxykit: it programs Kubernetes
// services as IPVS virtual servers in a network namespace, with the
// service addresses bound to a dummy interface ("proxykit-ipvs0" by
// default) and a small nftables table per IP family ("ip proxykit-ipvs",
// "ip6 proxykit-ipvs") for what IPVS does not do: masquerading, hairpin,
// load-balancer source ranges, rejecting services without endpoints and
// service addresses on ports that are not service ports.
//
// [New] returns a [proxier.Proxier]; [NewBackend] returns the bare
// [proxier.Backend] of one family. README.md describes the kernel
// contract: virtual servers, interface, table, chains, sets, marks and
// sysctls.
//
// # Lifetimes and contracts
//
// A backend owns the dummy interface, its tables, and the virtual servers
// it recorded in its tables or that sit on its interface's addresses;
// other virtual servers, tables and interfaces survive every sync and
// [proxier.Backend.Cleanup]. A full sync (the first of a process, the
// periodic one, and any after a failed operation) reads the kernel's IPVS
// table once and converges it: a restarted proxier adopts the virtual
// servers, real servers and addresses it finds, so established
// connections are not disturbed. The nftables table is flushed and
// refilled in one transaction, never deleted. Incremental syncs apply the difference for the changed
// service ports, computed from state kept in memory, and never read the
// kernel except to check draining real servers.
//
// Removed TCP real servers drain: they get weight 0 (no new connections)
// and are deleted once IPVS counts no connection to them, or after
// [Config.GracefulTerminationTimeout]; UDP and SCTP ones are deleted at
// once (the engine clears their conntrack entries). Session affinity is
// IPVS persistence with the service's timeout; note that IPVS keeps a
// client pinned while any of its connections is in IPVS's connection
// table, so timeouts shorter than IPVS's TIME_WAIT (2 minutes) are not
// honoured exactly.
//
// Two backends, of the same or of different namespaces, can live in one
// process: the package has no global state (moby/ipvs resolves the IPVS
// netlink family once per process, which is global to the kernel anyway).
package ipvs
