// Package ebpf is the eBPF backend of proxykit: it load-balances services
// at the socket, with cgroup v2 programs loaded by github.com/cilium/ebpf,
// and composes the nftables backend for the traffic that arrives from
// outside the node.
//
// [New] returns a [proxier.Proxier]; [NewBackend] returns the bare
// [proxier.Backend] of one family.
//
// # East-west: socket-level translation
//
// Programs on the connect4/6 and sendmsg4/6 hooks of the cgroup named by
// Config.CgroupPath rewrite the destination of a socket that connects
// (TCP, connected UDP) or sends (unconnected UDP) to a service address —
// a cluster IP, a node port on a node address, an external or
// load-balancer IP — to one of the service's endpoints, before any
// packet exists: no NAT, no conntrack entry, the endpoint sees the
// client's own address. Programs on recvmsg4/6 and getpeername4/6 show
// the service address again. Endpoints are picked at random, or per
// client network namespace with session affinity. A service without
// endpoints fails connect (and unconnected sendmsg) with ECONNREFUSED at
// once; a service whose traffic policy leaves no endpoint on this node
// fails with EPERM, a drop.
//
// Only sockets of the network namespaces the configuration names are
// translated: the node's (Config.NetNS) and Config.PodNetNS, or every one
// with Config.AllNetNS.
//
// # North-south: nftables
//
// Unless Config.SocketOnly is set, every family backend also drives an
// nftables backend (table Config.TableName, "proxykit-ebpf") with the
// same requests. It serves node ports, external and load-balancer IPs
// from outside the node, source ranges, SCTP, and any socket the programs
// do not translate; for sockets they do translate it sees only
// endpoint-addressed packets, which it leaves alone.
//
// # Lifetimes and contracts
//
// New probes the kernel and loads the programs; they are attached at the
// end of the first sync, once the maps are filled. With Config.PinPath
// the maps and the links are pinned there: a restarted proxier adopts
// the maps with their contents and swaps its programs into the pinned
// links, so sockets are never left untranslated, and Close leaves
// everything in place. Without PinPath, Close detaches the programs.
// Cleanup detaches and unpins everything, a predecessor's pins included,
// and deletes the nftables table.
//
// A full sync reads the maps and writes the difference with batch
// operations; an incremental sync writes the difference of the changed
// service ports, computed from state in memory. Writes are ordered so
// that a frontend never points at a missing endpoint slot. When an
// endpoint leaves a UDP service, connected UDP sockets translated to it
// are destroyed (kernel 6.5+, bpf_sock_destroy from a socket iterator),
// so the application sees an error and reconnects.
//
// README.md describes the kernel contract: hooks, maps, sizes and the
// minimum kernel per feature. The package has no global state; two
// proxiers (of different cgroups, namespaces or pin paths) can live in
// one process.
package ebpf
