// Package ebpf is the eBPF backend of proxykit: it load-balances services
// at the socket, with cgroup v2 programs loaded by github.com/cilium/ebpf,
// and composes the nftables backend for the traffic that arrives from
// outside the node.
//
// [New] returns a [proxier.Proxier] ([NewProxier] the same as a
// [*Proxier]); [NewBackend] returns the bare [proxier.Backend] of one
// family.
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
// the service address again. Endpoints are picked at random, by Maglev
// consistent hashing (per service port, else Config.Scheduler; see
// [Schedulers]), or per
// client network namespace with session affinity. A service without
// endpoints fails connect (and unconnected sendmsg) with ECONNREFUSED at
// once; a service whose traffic policy leaves no endpoint on this node
// fails with EPERM, a drop.
//
// Only sockets of the network namespaces the configuration names are
// translated: the node's (Config.NetNS) and the pods' (Config.PodNetNS,
// changed while the proxier runs with [Proxier.AddPodNetNS] and
// [Proxier.RemovePodNetNS]), or every one with Config.AllNetNS.
//
// # Maglev selection
//
// Every endpoint group of a service port that picks with Maglev has a
// Maglev lookup table of Config.MaglevTableSize entries (a prime,
// default 1021), built in Go from the group's endpoints as in the Maglev
// paper and stored in a BPF hash map keyed by group. The connect and sendmsg programs index it with
// a hash of the client socket's identity: its network namespace, source
// address and port when the socket has a local port, else its socket
// cookie (an unbound socket gets its port only after the hook). A client
// identity keeps its endpoint while the endpoint stays; when one of N
// endpoints leaves or joins, about 1/N of the identities move (plus a few
// percent, growing with N relative to the table size). Session affinity
// keeps its own path.
//
// A service port picks with Maglev when its Scheduler
// ([model.ServicePort.Scheduler], the proxykit.io/scheduler annotation)
// is [proxier.SchedulerMaglev] ("mh", IPVS's name, or "maglev",
// Cilium's), at random when it is "random", and as Config.Scheduler says
// when it is empty; any other value also gets Config.Scheduler, and is
// logged once per service port and value. A change of Scheduler takes effect at the next sync. Tables
// are per endpoint group, never shared between service ports, so two
// service ports with the same endpoints can pick differently.
//
// The tables are preallocated: Config.MaxMaglevTables × 4.1 KiB per
// family at the default size. It defaults to 16,384 tables (68 MB; 41 MB
// for 10,000 service ports) with [proxier.SchedulerMaglev] and to 256
// (1 MiB) with [proxier.SchedulerRandom], where only service ports asking
// for Maglev use one; service ports beyond it pick at random, with a warning.
//
// # North-south: nftables
//
// Unless Config.SocketOnly is set (or Config.NorthSouth is tc, below),
// every family backend also drives an nftables backend (table
// Config.TableName, "proxykit-ebpf") with the same requests. It serves
// node ports, external and load-balancer IPs from outside the node,
// source ranges, SCTP, and any socket the programs do not translate;
// for sockets they do translate it sees only endpoint-addressed
// packets, which it leaves alone.
//
// # North-south: tc
//
// With Config.NorthSouth set to [NorthSouthTC] there is no nftables
// table and no netfilter rule: tc programs (bpf/nodeport.c) on the
// ingress of every Ethernet interface of the node's namespace serve
// node ports, external and load-balancer IPs (and cluster IPs reached
// as packets): frontend lookup, source ranges, endpoint pick (random,
// Maglev per service port, or the client's with session affinity), DNAT, SNAT to the node for a
// remote endpoint with externalTrafficPolicy Cluster, connection
// tracking and reverse NAT in LRU maps, forwarding with bpf_fib_lookup
// and bpf_redirect_neigh, ICMP port unreachable for services without
// endpoints, drop for Local without a local endpoint, ICMP
// fragmentation needed for a packet too big for the route, and ICMP
// errors about tracked flows translated as conntrack translates related
// packets. The node's own TCP and UDP packets pass no tc program (its
// SCTP ones pk_tc_out, below): for its sockets, a
// load-balancer IP with source ranges is a node-only frontend of the
// socket maps, admitted or dropped (EPERM) by the source the node's
// routes give toward it at each sync of the service port. Programs attach
// with tcx links (kernel 6.6+) or a clsact qdisc and a cls_bpf filter,
// at every sync to the interfaces present then, known by index: an
// interface deleted and created again gets its program at the next
// sync.
// SNATed flows take source ports from Config.NorthSouthSNATPorts (by
// default the widest run of ports from 1024 outside the node's
// ephemeral range), first the client's own port, or its image in the
// range, so that a client tuple keeps its SNAT tuple; a closed TCP
// flow's port and an idle UDP flow's are taken again.
//
// With Config.NorthSouthForwarding [ForwardingDSR] (or [ForwardingHybrid]
// for TCP, or a Service's proxykit.io/forwarding-mode "dsr") a flow to a
// remote endpoint is not SNATed: the packet, translated to the endpoint,
// goes there wrapped in IPIP (IPv6: IP6IP6) from the frontend's address,
// with the frontend's port in the outer IPv4 id (the IPv6 flow label).
// The endpoint's node, running the tc programs too, unwraps it when it
// goes to one of its own endpoints (pk_nsloc), records a reverse entry,
// and the endpoint's replies leave for the client from there, translated
// back to the frontend. XDP passes these flows to tc.
//
// # North-south: XDP
//
// With [NorthSouthXDP] an XDP program (bpf/xdp.c, the same datapath in
// bpf/nodeport.h) runs in native mode on the external interfaces in
// front of the tc programs. A packet whose translation leaves through
// an interface taking XDP frames (back out of the one it came in on:
// XDP_TX; another listed in pk_xdptx: XDP_REDIRECT) never becomes an
// skb; every other packet (to a pod's veth, an unresolved neighbour, a
// reject) goes on untranslated to tc, which finds the flow XDP
// recorded. XDP sends out of a veth only with Config.NorthSouthXDPVeth
// (its peer may not take XDP frames), and an interface without native
// XDP is served by tc alone.
//
// With Config.PinPath the tc and XDP links and the north-south maps
// are pinned (tc_pin.go): a restart keeps established and new
// connections. SCTP is served at tc (its CRC32c updated on a port
// change), the node's own SCTP packets by pk_tc_out at the egress of the
// external interfaces. See README.md for what is not there yet.
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
// # Minimum kernel
//
// 5.18 for everything together; per feature:
//
//   - cgroup connect4/6 hooks (TCP, connected UDP): 4.17
//   - cgroup sendmsg4/6 (unconnected UDP): 4.18
//   - cgroup recvmsg4/6 (recvfrom shows the service): 5.2
//   - bpf_sock_addr.sk, the socket's bound address and port (Maglev client hash): 5.3
//   - batch map operations on hash maps (full syncs): 5.6
//   - bpf_get_netns_cookie in sock_addr programs (namespace allowlist,
//     affinity, Maglev client hash), cgroup bpf_link and LINK_UPDATE
//     (restart without a gap): 5.7
//   - cgroup getpeername4/6: 5.8
//   - SO_NETNS_COOKIE (cookies of the configured namespaces): 5.14
//   - bpf_set_retval (ECONNREFUSED for services without endpoints): 5.18
//   - optional: UDP socket iterator with the bpf_sock_destroy kfunc and
//     kernel BTF (destroying connected UDP sockets of removed
//     endpoints): 6.5
//
// README.md describes the kernel contract: hooks, maps, sizes and the
// minimum kernel per feature. The package has no global state; two
// proxiers (of different cgroups, namespaces or pin paths) can live in
// one process.
package ebpf
