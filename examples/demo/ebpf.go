package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/sandbox"
)

// showEBPF says where the eBPF backend put what: east-west traffic in
// the socket programs' maps, traffic from outside in its nftables table.
func showEBPF(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	fmt.Fprintln(w, "\nWhat ebpf programmed in node1: socket programs on the demo's own cgroup translate the")
	fmt.Fprintln(w, "connections of node1 and its pods in connect() and sendmsg(), from BPF maps, before any packet")
	fmt.Fprintln(w, "exists. Traffic from outside the node (node ports), and sockets the programs do not see, take")
	fmt.Fprintln(w, "the nftables table below.")
	return showNftTable(ebpf.DefaultTableName)(ctx, w, node, name)
}
