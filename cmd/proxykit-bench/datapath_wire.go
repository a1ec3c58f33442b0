package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
)

// The hosts around node1 stand for the wire, on every path alike: the
// far ends of node1's external veths (the client's eth0, node2's node1,
// the uplink's eth0) run an XDP program that passes everything and send
// complete checksums (no transmit checksum offload), as a NIC receives
// frames from a wire. A veth whose peer runs an XDP program takes XDP
// frames (XDP_TX, XDP_REDIRECT from node1), and XDP, which cannot finish
// a partial checksum, needs complete ones: that is what the eBPF
// backend's NorthSouthXDPVeth asks of the rig (backends/ebpf/setup.go;
// the tests' wireLikePeers does the same). The other paths run on the
// same rig, so that the paths stay comparable: the peers' receive side
// then works in NAPI, with its XDP program, for every path.

// wirePeer is one far end of an external veth of node1.
type wirePeer struct {
	ns  *testnet.NS
	dev string
}

// wirePeers returns the far ends of node1's external veths.
func wirePeers(t *testnet.Topology) []wirePeer {
	return []wirePeer{
		{t.Client.NS, "eth0"},
		{t.Node2.NS, testnet.Node1Name},
		{t.Uplink.NS, "eth0"},
	}
}

// wireLike holds what makes a topology's peers wire-like: the XDP pass
// program and its attachments. Closing it detaches the program (the
// checksum setting goes with the namespaces).
type wireLike struct {
	prog  *ebpf.Program
	links []link.Link
}

// Close detaches and unloads the XDP program.
func (w *wireLike) Close() error {
	var errs []error
	for _, l := range w.links {
		errs = append(errs, l.Close())
	}
	if w.prog != nil {
		errs = append(errs, w.prog.Close())
	}
	return errors.Join(errs...)
}

var _ io.Closer = (*wireLike)(nil)

// makeWireLike attaches an XDP program that passes every packet (native
// mode) to each of node1's external veths' far ends and turns their
// transmit checksum offload off.
func makeWireLike(t *testnet.Topology) (*wireLike, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pk_bench_pass", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		return nil, fmt.Errorf("XDP pass program: %w", err)
	}
	w := &wireLike{prog: prog}
	for _, p := range wirePeers(t) {
		err := p.ns.Do(func() error {
			ifi, err := net.InterfaceByName(p.dev)
			if err != nil {
				return err
			}
			l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifi.Index, Flags: link.XDPDriverMode})
			if err != nil {
				return fmt.Errorf("attach: %w", err)
			}
			w.links = append(w.links, l)
			return nil
		})
		if err == nil {
			err = ethtoolSet(p.ns, p.dev, ethtoolSTXCSUM, false)
		}
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("wire-like %s of %s: %w", p.dev, p.ns.Name(), err)
		}
	}
	return w, nil
}

// ethtool commands (linux/ethtool.h).
const (
	ethtoolSTXCSUM = 0x17 // transmit checksum offload
	ethtoolSGRO    = 0x2c // generic receive offload
)

// ethtoolSet sets one ethtool flag (a set command such as
// ETHTOOL_STXCSUM) of a namespace's interface, with the SIOCETHTOOL
// ioctl, as ethtool -K does.
func ethtoolSet(ns *testnet.NS, device string, cmd uint32, on bool) error {
	return ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v := struct{ cmd, data uint32 }{cmd: cmd}
		if on {
			v.data = 1
		}
		var req struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [8]byte
		}
		copy(req.name[:], device)
		req.data = unsafe.Pointer(&v)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req))); errno != 0 {
			return fmt.Errorf("ethtool %#x %s: %w", cmd, device, errno)
		}
		runtime.KeepAlive(&v)
		return nil
	})
}
