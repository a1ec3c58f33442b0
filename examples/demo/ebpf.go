package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/sandbox"
)

// newEBPF starts the eBPF backend for the sandbox. Its socket programs
// translate the sockets of processes in a cgroup; the demo's probes and
// servers are goroutines of this process, so the demo creates a cgroup v2
// of its own, moves itself into it and attaches there: no other process
// of the machine is affected. The returned release moves the process
// back and removes the cgroup; call it after the proxier is closed.
func newEBPF(cfg proxier.Config, sb *sandbox.Sandbox) (proxier.Proxier, func() error, error) {
	cg, err := sandbox.EnterCgroup("proxykit-demo-")
	if err != nil {
		return nil, nil, fmt.Errorf("a cgroup v2 for the socket programs: %w", err)
	}
	pods := make([]string, 0, len(sb.Node1.Pods))
	for _, p := range sb.Node1.Pods {
		pods = append(pods, p.NetNSPath())
	}
	p, err := ebpf.New(ebpf.Config{Config: cfg, CgroupPath: cg.Path(), PodNetNS: pods})
	if err != nil {
		return nil, nil, errors.Join(err, cg.Leave())
	}
	return p, cg.Leave, nil
}

// showEBPF says where the eBPF backend put what: east-west traffic in
// the socket programs' maps, traffic from outside in its nftables table.
func showEBPF(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	fmt.Fprintln(w, "\nWhat ebpf programmed in node1: socket programs on the demo's own cgroup translate the")
	fmt.Fprintln(w, "connections of node1 and its pods in connect() and sendmsg(), from BPF maps, before any packet")
	fmt.Fprintln(w, "exists. Traffic from outside the node (node ports), and sockets the programs do not see, take")
	fmt.Fprintln(w, "the nftables table below.")
	return showNftTable(ebpf.DefaultTableName)(ctx, w, node, name)
}
