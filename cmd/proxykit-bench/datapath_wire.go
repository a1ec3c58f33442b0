package main

import (
	"encoding/binary"
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
// program and its attachments, and the sink that node2's side can run
// instead (sinkOn). Closing it detaches the programs (the checksum
// setting goes with the namespaces).
type wireLike struct {
	prog  *ebpf.Program
	links []link.Link
	// node2 is the attachment on node2's interface toward node1 (one
	// of links), which sinkOn switches between prog and sink.
	node2 link.Link
	sink  *xdpSink
}

// Close detaches and unloads the XDP programs.
func (w *wireLike) Close() error {
	var errs []error
	for _, l := range w.links {
		errs = append(errs, l.Close())
	}
	if w.prog != nil {
		errs = append(errs, w.prog.Close())
	}
	if w.sink != nil {
		errs = append(errs, w.sink.Close())
	}
	return errors.Join(errs...)
}

// sinkOn makes node2's interface toward node1 run the sink (on) or the
// pass program again (off), in place: the link is updated, so that
// there is no moment without an XDP program (in which the veth would
// stop taking XDP frames from node1).
func (w *wireLike) sinkOn(on bool) error {
	prog := w.prog
	if on {
		prog = w.sink.prog
	}
	if err := w.node2.Update(prog); err != nil {
		return fmt.Errorf("node2's XDP program to the sink (%v): %w", on, err)
	}
	return nil
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
	if w.sink, err = newXDPSink(); err != nil {
		w.Close()
		return nil, err
	}
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
			if p.ns == t.Node2.NS {
				w.node2 = l
			}
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

// The sink: for the run that measures what node1 alone forwards, node2's
// interface toward node1 runs, instead of the pass program, one that
// counts every IPv4 packet from node1 in a per-CPU array and drops it
// (XDP_DROP), so that node2's routing and the pod's delivery (and its
// ICMP port unreachable) leave the CPU that node1's receive thread
// runs on. Other packets (ARP) pass, so that node1 keeps node2's
// neighbour entry. What node1 sends node2 inside IPIP (direct server
// return) is IPv4 too and counted alike.

// xdpSink is the sink program and its counter.
type xdpSink struct {
	prog  *ebpf.Program
	count *ebpf.Map // per-CPU array of one uint64
}

// XDP actions (linux/bpf.h).
const (
	xdpDrop = 1
	xdpPass = 2
)

// sinkInstructions returns the sink program, counting in the map whose
// file descriptor is countFD.
func sinkInstructions(countFD int) asm.Instructions {
	// The EtherType as a native-endian load of its two bytes reads it.
	ethIPv4 := int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))
	return asm.Instructions{
		// r2 = ctx->data, r3 = ctx->data_end (struct xdp_md).
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R4, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R4, ethIPv4, "pass"),
		// count[0]++ (this CPU's slot: no atomic needed).
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, countFD),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("drop"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// newXDPSink loads the sink program and its counter.
func newXDPSink() (*xdpSink, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "pk_bench_sink", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("XDP sink counter: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pk_bench_sink", Type: ebpf.XDP, License: "GPL",
		Instructions: sinkInstructions(m.FD())})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("XDP sink program: %w", err)
	}
	return &xdpSink{prog: prog, count: m}, nil
}

// Close unloads the program and its counter.
func (s *xdpSink) Close() error {
	return errors.Join(s.prog.Close(), s.count.Close())
}

// mapID returns the counter's ID, by which another process (the UDP
// sender, which reads it at the edges of its window) opens it.
func (s *xdpSink) mapID() (uint32, error) {
	info, err := s.count.Info()
	if err != nil {
		return 0, err
	}
	id, ok := info.ID()
	if !ok {
		return 0, errors.New("the kernel gives the sink's counter no ID")
	}
	return uint32(id), nil
}

// readSink returns the sum over CPUs of the sink counter with ID id.
func readSink(id uint32) (uint64, error) {
	m, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return 0, fmt.Errorf("sink counter %d: %w", id, err)
	}
	defer m.Close()
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("sink counter %d: %w", id, err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
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
