package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/proxier"
)

// newEBPF starts the eBPF backend for the sandbox. Its socket programs
// translate the sockets of processes in a cgroup; the demo's probes and
// servers are goroutines of this process, so the demo creates a cgroup v2
// of its own, moves itself into it and attaches there: no other process
// of the machine is affected. The returned release moves the process
// back and removes the cgroup; call it after the proxier is closed.
func newEBPF(cfg proxier.Config, topo *testnet.Topology) (proxier.Proxier, func() error, error) {
	cg, release, err := ownCgroup()
	if err != nil {
		return nil, nil, fmt.Errorf("a cgroup v2 for the socket programs: %w", err)
	}
	pods := make([]string, 0, len(topo.Node1.Pods))
	for _, p := range topo.Node1.Pods {
		pods = append(pods, p.Path())
	}
	p, err := ebpf.New(ebpf.Config{Config: cfg, CgroupPath: cg, PodNetNS: pods})
	if err != nil {
		return nil, nil, errors.Join(err, release())
	}
	return p, release, nil
}

// showEBPF says where the eBPF backend put what: east-west traffic in
// the socket programs' maps, traffic from outside in its nftables table.
func showEBPF(ctx context.Context, w io.Writer, node *testnet.Node, name func(netip.Addr) string) error {
	fmt.Fprintln(w, "\nWhat ebpf programmed in node1: socket programs on the demo's own cgroup translate the")
	fmt.Fprintln(w, "connections of node1 and its pods in connect() and sendmsg(), from BPF maps, before any packet")
	fmt.Fprintln(w, "exists. Traffic from outside the node (node ports), and sockets the programs do not see, take")
	fmt.Fprintln(w, "the nftables table below.")
	return showNftTable(ebpf.DefaultTableName)(ctx, w, node, name)
}

// ownCgroup creates a cgroup v2 directory under the cgroup2 mount, moves
// this process into it and returns it, with the function that moves the
// process back and removes the directory.
func ownCgroup() (string, func() error, error) {
	mount, err := cgroup2Mount()
	if err != nil {
		return "", nil, err
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", nil, err
	}
	orig := ""
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			orig = filepath.Join(mount, p)
		}
	}
	if orig == "" {
		return "", nil, errors.New("this process has no cgroup v2 membership")
	}
	var id [4]byte
	rand.Read(id[:])
	dir := filepath.Join(mount, "proxykit-demo-"+hex.EncodeToString(id[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, err
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("move the demo into %s: %w", dir, err)
	}
	release := func() error {
		if err := os.WriteFile(filepath.Join(orig, "cgroup.procs"), pid, 0); err != nil {
			return fmt.Errorf("move the demo back to %s: %w", orig, err)
		}
		return os.Remove(dir)
	}
	return dir, release, nil
}

// cgroup2Mount returns where the cgroup v2 file system is mounted.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mount point (field 5) ... " - " fstype ...
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if fs := strings.Fields(pre); len(fs) >= 5 {
			return fs[4], nil
		}
	}
	return "", errors.New("no cgroup2 file system is mounted")
}
