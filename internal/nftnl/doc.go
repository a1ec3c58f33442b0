// Package nftnl is proxykit's one nf_tables writer and reader: every
// backend that programs nf_tables (nftables, IPVS's helper table, the
// iptables runner's table clean-up, and eBPF's north-south table through
// the nftables backend) goes through it.
//
// It has four parts:
//
//   - Batches. A [Batch] is one nf_tables transaction under construction:
//     netlink messages appended to one buffer, each labelled with what it
//     does and an opaque owner value the caller sets ([Batch.SetOwner]), so
//     that a rejected transaction ([TxError]) names the object whose message
//     the kernel refused. Rule expressions are encoded once, by
//     google/nftables' expr package ([Encode]); the framing is done here.
//   - Connections. [Conn] commits batches and answers the few queries the
//     backends make (does a table exist, its chains, sets and set
//     elements). [Dial] returns one on a NETLINK_NETFILTER socket opened in
//     a network namespace; the kernel is asked to acknowledge only the last
//     message of a batch. A [Recorder] implements the same interface in
//     memory: it applies batches to a model of the kernel's tables and
//     renders each one as nft-like text, for root-less golden tests.
//   - Family and key encoding. [Family] holds what differs between ip and
//     ip6 tables (protocol, address length and offsets, address datatype,
//     ICMP port-unreachable code); keys are concatenations whose fields are
//     padded to 4 bytes ([Family.Key], [PortKey]); [Datatype] names nft's
//     key and data types.
//   - Rule builders shared by the backends: payload and meta loads, set
//     lookups and verdict maps, conntrack state, fib, marks, masquerade,
//     reject.
//
// [DecodeBatch] and [Text] turn nf_tables messages, from a batch or a
// kernel dump ([NetlinkConn.List]), back into text; the recorder uses
// them. [NetlinkConn.ReadTable] reads a whole table back as values
// (chains with their encoded rules, sets with their elements; rules
// decode with [DecodeExprs] and print with [ExprText]), and
// [Table.Follow] works out from it where a packet to a service goes: the
// nftables backend's public ReadTable, which the demo prints, is built on
// them.
//
// Nothing here holds global state. A Batch and a Conn are not safe for
// concurrent use.
package nftnl
