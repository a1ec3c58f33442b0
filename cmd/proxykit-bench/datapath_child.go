package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// The data-path mode's child roles (see datapath.go): the proxier of a
// path, the tight TCP server in the endpoint pod, the TCP_CRR load
// generator and the UDP sender in the client namespace.
const (
	roleDPProxier  = "dp-proxier"
	roleCRRServer  = "crr-server"
	roleCRRClient  = "crr-client"
	roleUDPSender  = "udp-sender"
	crrRequestLen  = 32 // bytes of a TCP_CRR request and of its response
	udpFrameLen    = 60 // Ethernet frame of the UDP sender, no FCS
	udpBatch       = 64 // frames per sendmmsg
	crrIOTimeoutMS = 2000
)

// datapathRoles are the child roles of the data-path mode.
var datapathRoles = map[string]func(*bufio.Reader) error{
	roleDPProxier: dpProxierChild,
	roleCRRServer: crrServerChild,
	roleCRRClient: crrClientChild,
	roleUDPSender: udpSenderChild,
}

// dpProxierParams is the data-path proxier child's input.
type dpProxierParams struct {
	Backend string
	IPTMode string
	// EBPF sets fields of ebpf.Config by name (see setConfigFields).
	EBPF  map[string]string `json:",omitempty"`
	NetNS string
	// NodeName is the proxier's node, empty for node1. The measured
	// services' endpoint is on node2: local to node2's proxier (a DSR
	// path's), which unwraps what node1 sends it.
	NodeName string `json:",omitempty"`
	// PodNetNS are the pods' namespaces of the eBPF backend
	// (ebpf.Config.PodNetNS).
	PodNetNS []string `json:",omitempty"`
	Cgroup   string
	// Size is of the filler services; node2's proxier has none.
	Size     Size
	Endpoint netip.Addr
	// XDPCounters gives the proxier a metrics registry and makes the
	// child answer a line "xdp" with what the XDP program did
	// (proxykit_ebpf_xdp_packets_total).
	XDPCounters bool `json:",omitempty"`
}

// xdpCounts are the XDP north-south program's counters
// (proxykit_ebpf_xdp_packets_total by action): packets it sent back out
// of the interface they came in on, redirected out of another, and
// passed to tc.
type xdpCounts struct {
	TX       uint64 `json:"tx"`
	Redirect uint64 `json:"redirect"`
	Pass     uint64 `json:"pass"`
}

// sub returns the increase from b to x.
func (x xdpCounts) sub(b xdpCounts) xdpCounts {
	return xdpCounts{TX: x.TX - b.TX, Redirect: x.Redirect - b.Redirect, Pass: x.Pass - b.Pass}
}

// describe is the counters for a log line, empty for nil.
func (x *xdpCounts) describe() string {
	if x == nil {
		return ""
	}
	return fmt.Sprintf("; XDP redirected %d, sent back %d, passed %d", x.Redirect, x.TX, x.Pass)
}

// Total is every packet the program served.
func (x xdpCounts) Total() uint64 { return x.TX + x.Redirect + x.Pass }

// xdpMetric is the eBPF backend's XDP counter.
const xdpMetric = "proxykit_ebpf_xdp_packets_total"

// gatherXDP reads xdpMetric from reg.
func gatherXDP(reg *prometheus.Registry) (xdpCounts, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return xdpCounts{}, err
	}
	for _, mf := range mfs {
		if mf.GetName() != xdpMetric {
			continue
		}
		var x xdpCounts
		for _, m := range mf.GetMetric() {
			n := uint64(m.GetCounter().GetValue())
			for _, l := range m.GetLabel() {
				if l.GetName() != "action" {
					continue
				}
				switch l.GetValue() {
				case "tx":
					x.TX = n
				case "redirect":
					x.Redirect = n
				case "pass":
					x.Pass = n
				}
			}
		}
		return x, nil
	}
	return xdpCounts{}, fmt.Errorf("no %s: the backend runs no XDP program", xdpMetric)
}

// dpProxierChild runs one path's proxier in node1's namespace: the
// filler services of the size and the measured services, the first sync,
// a report; then it answers "xdp" lines (XDPCounters) until any other
// line (or the end of its input), and closes the proxier.
func dpProxierChild(in *bufio.Reader) error {
	var p dpProxierParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	node := p.NodeName
	if node == "" {
		node = testnet.Node1Name
	}
	cfg := proxier.Config{
		NetNS:                 p.NetNS,
		NodeName:              node,
		Families:              []model.IPFamily{model.IPv4},
		MinSyncInterval:       time.Millisecond,
		SyncPeriod:            time.Hour,
		NoServiceHealthChecks: true,
		Logger:                slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	var reg *prometheus.Registry
	if p.XDPCounters {
		reg = prometheus.NewRegistry()
		cfg.Registerer = reg
	}
	pp := proxierParams{Backend: p.Backend, IPTMode: p.IPTMode, EBPF: p.EBPF, Cgroup: p.Cgroup, PodNetNS: p.PodNetNS, Size: p.Size, Target: []netip.Addr{p.Endpoint}}
	pr, err := newProxier(pp, cfg)
	if err != nil {
		var un *unavailableError
		switch {
		case errors.As(err, &un):
			return out.Encode(childResult{Unavailable: err.Error()})
		case errors.Is(err, proxier.ErrNotSupported):
			return out.Encode(childResult{Unsupported: err.Error()})
		case len(p.EBPF) > 0:
			// An option of a path the backend does not accept (yet):
			// the path is not available, which is not a failure.
			return out.Encode(childResult{Unavailable: err.Error()})
		}
		return err
	}
	objs, slices := scale.Objects(dpFiller(p.Size))
	for i, d := range dpMeasured {
		o, s := d.objects(len(objs)+i, p.Endpoint)
		objs, slices = append(objs, o), append(slices, s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	for _, o := range objs {
		pr.OnServiceAdd(o)
	}
	for _, s := range slices {
		pr.OnEndpointSliceAdd(s)
	}
	pr.OnServiceSynced()
	pr.OnEndpointSlicesSynced()
	done := make(chan error, 1)
	go func() { done <- pr.Run(ctx) }()
	if err := pr.Flush(ctx); err != nil {
		return fmt.Errorf("first sync: %w", err)
	}
	if err := out.Encode(childResult{SyncSeconds: time.Since(start).Seconds(), HWMKB: procStatusKB("VmHWM")}); err != nil {
		return err
	}
	for {
		line, _ := in.ReadString('\n')
		if strings.TrimSpace(line) != "xdp" || reg == nil {
			break
		}
		res := childResult{}
		x, err := gatherXDP(reg)
		if err != nil {
			res.Error = err.Error()
		} else {
			res.XDP = &x
		}
		if err := out.Encode(res); err != nil {
			return err
		}
	}
	cancel()
	<-done
	runtime.KeepAlive(objs)
	if err := pr.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return out.Encode(childResult{})
}

// crrServerParams is the TCP_CRR server's input.
type crrServerParams struct {
	NetNS   string
	Port    uint16
	Threads int
}

// crrServerChild serves TCP_CRR transactions in a pod: Threads sockets
// bound with SO_REUSEPORT to Port, each on a locked thread doing blocking
// accept, read the request, write the response, close (the server closes
// first, as an HTTP/1.0 server does, so that the client keeps no
// TIME_WAIT). It writes a line when it listens and serves until its
// input ends.
func crrServerChild(in *bufio.Reader) error {
	var p crrServerParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	ns, err := netns.Open(p.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	var fds []int
	for range max(1, p.Threads) {
		var fd int
		err := ns.Do(func() error {
			var err error
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(p.Port)}); err != nil {
				return err
			}
			return unix.Listen(fd, 4096)
		})
		if err != nil {
			return fmt.Errorf("listen on port %d: %w", p.Port, err)
		}
		fds = append(fds, fd)
	}
	for _, fd := range fds {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the process
			resp := make([]byte, crrRequestLen)
			copy(resp, "proxykit-bench response\n")
			buf := make([]byte, 256)
			for {
				c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
				if err != nil {
					if err == unix.EINTR || err == unix.ECONNABORTED || err == unix.EMFILE || err == unix.ENFILE {
						continue
					}
					return
				}
				tv := unix.NsecToTimeval(crrIOTimeoutMS * 1e6)
				unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
				unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
				if readFull(c, buf[:crrRequestLen]) == nil {
					writeAll(c, resp)
				}
				unix.Close(c)
			}
		}()
	}
	fmt.Println(`{}`)
	in.ReadString('\n') // until the parent is done
	return nil
}

// readFull reads len(b) bytes from the blocking socket fd.
func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return errors.New("connection closed early")
		}
		b = b[n:]
	}
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// crrClientParams is the TCP_CRR load generator's input.
type crrClientParams struct {
	NetNS    string
	Dst      netip.AddrPort
	Clients  int
	WarmupMS int64
	RunMS    int64
}

// crrResult is one TCP_CRR run.
type crrResult struct {
	// Conns are the transactions completed in the timed window, Errors
	// those that failed (connect, read or write; timeouts included).
	Conns  int     `json:"conns"`
	Errors int     `json:"errors"`
	PerSec float64 `json:"per_sec"`
	// Latency is of whole transactions (socket to close), µs: every
	// transaction started in the window, also those that ended after it.
	Latency Stats `json:"latency_us"`
	// FirstError is the first failure, if any.
	FirstError string `json:"first_error,omitempty"`
	// XDP is what node1's XDP program did over the whole run (warm-up
	// and the client's start included), on paths with one.
	XDP *xdpCounts `json:"xdp,omitempty"`
	// DSR are the packets from node2 over the whole run, on paths with
	// direct server return.
	DSR *dsrCounts `json:"dsr,omitempty"`
}

// crrClientChild runs Clients concurrent clients in the client
// namespace, each on a locked thread with blocking system calls:
// socket, connect, write the request, read the response, read the
// server's close, close. Transactions completed in the warm-up are not
// counted; the window is RunMS after it.
func crrClientChild(in *bufio.Reader) error {
	var p crrClientParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	ns, err := netns.Open(p.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	sa := &unix.SockaddrInet4{Port: int(p.Dst.Port()), Addr: p.Dst.Addr().As4()}
	req := make([]byte, crrRequestLen)
	copy(req, "proxykit-bench request\n")
	// One transaction first: a path that does not connect fails here,
	// not as a run full of timeouts.
	if err := ns.Do(func() error { _, err := crrTransaction(sa, req, make([]byte, 256)); return err }); err != nil {
		return fmt.Errorf("first connection to %s: %w", p.Dst, err)
	}
	start := time.Now()
	from := start.Add(time.Duration(p.WarmupMS) * time.Millisecond)
	to := from.Add(time.Duration(p.RunMS) * time.Millisecond)
	type worker struct {
		lat      []int64 // every transaction started in the window
		done     int     // those that ended in it
		errs     int
		firstErr error
	}
	ws := make([]worker, max(1, p.Clients))
	var wg sync.WaitGroup
	for i := range ws {
		wg.Go(func() {
			w := &ws[i]
			buf := make([]byte, 256)
			ns.Do(func() error {
				for {
					t0 := time.Now()
					if !t0.Before(to) {
						return nil
					}
					d, err := crrTransaction(sa, req, buf)
					if t0.Before(from) {
						continue
					}
					if err != nil {
						w.errs++
						if w.firstErr == nil {
							w.firstErr = err
						}
						continue
					}
					w.lat = append(w.lat, d.Nanoseconds())
					if t0.Add(d).Before(to) {
						w.done++
					}
				}
			})
		})
	}
	wg.Wait()
	var res crrResult
	var lat []int64
	for _, w := range ws {
		lat = append(lat, w.lat...)
		res.Conns += w.done
		res.Errors += w.errs
		if w.firstErr != nil && res.FirstError == "" {
			res.FirstError = w.firstErr.Error()
		}
	}
	res.PerSec = float64(res.Conns) / to.Sub(from).Seconds()
	res.Latency = stats(lat, 1e3)
	return json.NewEncoder(os.Stdout).Encode(childResult{CRR: &res})
}

// crrTransaction makes one TCP_CRR transaction and returns how long it
// took.
func crrTransaction(sa *unix.SockaddrInet4, req, buf []byte) (time.Duration, error) {
	start := time.Now()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	tv := unix.NsecToTimeval(crrIOTimeoutMS * 1e6)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := connect(fd, sa, start.Add(crrIOTimeoutMS*time.Millisecond)); err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	if err := writeAll(fd, req); err != nil {
		return 0, fmt.Errorf("write: %w", err)
	}
	if err := readFull(fd, buf[:crrRequestLen]); err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	// The server closes first: wait for its FIN, so that this side
	// closes without TIME_WAIT.
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read the close: %w", err)
		}
		if n == 0 {
			break
		}
	}
	unix.Close(fd)
	fd = -1
	return time.Since(start), nil
}

// udpSenderParams is the UDP sender's input.
type udpSenderParams struct {
	// NetNS is the client namespace; Device its interface toward node1.
	NetNS, Device string
	// SrcMAC and DstMAC are the client's and node1's interface
	// addresses; Src the client's IPv4 address, Dst where the datagrams
	// go.
	SrcMAC, DstMAC string
	Src            netip.Addr
	Dst            netip.AddrPort
	// Flows is how many source ports the datagrams cycle through.
	Flows int
	// CPU, when not negative, pins the sending thread.
	CPU      int
	WarmupMS int64
	RunMS    int64
	// Counters are the interfaces whose counters are read at the start
	// and at the end of the window: namespace path and interface.
	Counters []counterRef
	// SinkMapID, when not zero, is the ID of the XDP sink's counter
	// (datapath_wire.go), read with the interface counters.
	SinkMapID uint32 `json:",omitempty"`
}

// counterRef names one interface of one namespace.
type counterRef struct {
	Name   string // what the result calls it
	NetNS  string
	Device string
}

// ifCounters are an interface's packet counters.
type ifCounters struct {
	RxPackets uint64 `json:"rx_packets"`
	RxDropped uint64 `json:"rx_dropped"`
	TxPackets uint64 `json:"tx_packets"`
	TxDropped uint64 `json:"tx_dropped"`
}

// udpResult is one UDP run: what was sent in the window and the
// counters' increase over it.
type udpResult struct {
	Seconds  float64               `json:"seconds"`
	Sent     uint64                `json:"sent"`
	Counters map[string]ifCounters `json:"counters"`
	// XDP is what node1's XDP program did over the whole run (warm-up
	// and the sender's start included), on paths with one.
	XDP *xdpCounts `json:"xdp,omitempty"`
	// DSR are the packets from node2 over the whole run, on paths with
	// direct server return.
	DSR *dsrCounts `json:"dsr,omitempty"`
	// Sink is, in a run with node2's XDP sink, the IPv4 packets from
	// node1 that it counted and dropped in the window: what node1
	// forwarded toward node2.
	Sink *uint64 `json:"sink_packets,omitempty"`
}

// udpSenderChild sends pre-built UDP frames at full speed from an
// AF_PACKET socket (PACKET_QDISC_BYPASS, sendmmsg of udpBatch frames) in
// the client namespace to node1, cycling through Flows source ports, and
// reads the named interface counters at the start and at the end of the
// timed window.
func udpSenderChild(in *bufio.Reader) error {
	var p udpSenderParams
	if err := readParams(in, &p); err != nil {
		return err
	}
	src, err := net.ParseMAC(p.SrcMAC)
	if err != nil {
		return err
	}
	dst, err := net.ParseMAC(p.DstMAC)
	if err != nil {
		return err
	}
	ns, err := netns.Open(p.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	flows := max(udpBatch, (p.Flows+udpBatch-1)/udpBatch*udpBatch)
	frames := udpFrames(src, dst, p.Src, p.Dst, flows)

	var sent atomic.Uint64
	var stop atomic.Bool
	ready := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- ns.Do(func() error {
			if p.CPU >= 0 {
				var set unix.CPUSet
				set.Set(p.CPU)
				unix.SchedSetaffinity(0, &set)
			}
			fd, err := packetSocket(p.Device)
			if err != nil {
				ready <- err
				return nil
			}
			defer unix.Close(fd)
			ready <- nil
			return sendFrames(fd, frames, &sent, &stop)
		})
	}()
	if err := <-ready; err != nil {
		return err
	}
	fail := func(err error) error {
		stop.Store(true)
		<-done
		return err
	}
	time.Sleep(time.Duration(p.WarmupMS) * time.Millisecond)
	readSinkOf := func() (uint64, error) {
		if p.SinkMapID == 0 {
			return 0, nil
		}
		return readSink(p.SinkMapID)
	}
	c0, err := readCounters(p.Counters)
	if err != nil {
		return fail(err)
	}
	k0, err := readSinkOf()
	if err != nil {
		return fail(err)
	}
	s0, t0 := sent.Load(), time.Now()
	time.Sleep(time.Duration(p.RunMS) * time.Millisecond)
	s1, t1 := sent.Load(), time.Now()
	c1, err := readCounters(p.Counters)
	if err != nil {
		return fail(err)
	}
	k1, err := readSinkOf()
	if err != nil {
		return fail(err)
	}
	stop.Store(true)
	if err := <-done; err != nil {
		return err
	}
	res := udpResult{Seconds: t1.Sub(t0).Seconds(), Sent: s1 - s0, Counters: map[string]ifCounters{}}
	for name, a := range c1 {
		b := c0[name]
		res.Counters[name] = ifCounters{
			RxPackets: a.RxPackets - b.RxPackets, RxDropped: a.RxDropped - b.RxDropped,
			TxPackets: a.TxPackets - b.TxPackets, TxDropped: a.TxDropped - b.TxDropped,
		}
	}
	if p.SinkMapID != 0 {
		k := k1 - k0
		res.Sink = &k
	}
	return json.NewEncoder(os.Stdout).Encode(childResult{UDP: &res})
}

// packetSocket opens an AF_PACKET socket that sends on device and
// receives nothing (protocol 0), past the qdisc.
func packetSocket(device string) (int, error) {
	ifi, err := net.InterfaceByName(device)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("AF_PACKET socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind to %s: %w", device, err)
	}
	return fd, nil
}

// sendFrames sends frames round and round, udpBatch per sendmmsg, until
// stop, counting what the kernel took.
func sendFrames(fd int, frames [][]byte, sent *atomic.Uint64, stop *atomic.Bool) error {
	n := len(frames) // a multiple of udpBatch
	iovs := make([]unix.Iovec, n)
	hdrs := make([]unix.Mmsghdr, n)
	for i, f := range frames {
		iovs[i].Base = &f[0]
		iovs[i].SetLen(len(f))
		hdrs[i].Hdr.Iov = &iovs[i]
		hdrs[i].Hdr.SetIovlen(1)
	}
	for off := 0; !stop.Load(); off = (off + udpBatch) % n {
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[off])), udpBatch, 0, 0, 0)
		switch errno {
		case 0:
			sent.Add(uint64(r))
		case unix.EINTR, unix.ENOBUFS, unix.EAGAIN:
		default:
			return fmt.Errorf("sendmmsg: %w", errno)
		}
	}
	runtime.KeepAlive(frames)
	runtime.KeepAlive(iovs)
	return nil
}

// udpFrames builds n Ethernet frames of IPv4 UDP datagrams from src to
// dst, with source ports 10000 to 10000+n-1 and no UDP checksum.
func udpFrames(srcMAC, dstMAC net.HardwareAddr, src netip.Addr, dst netip.AddrPort, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		f := make([]byte, udpFrameLen)
		copy(f[0:6], dstMAC)
		copy(f[6:12], srcMAC)
		binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
		ip := f[14:34]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], udpFrameLen-14)
		ip[6] = 0x40 // don't fragment
		ip[8] = 64
		ip[9] = unix.IPPROTO_UDP
		s, d := src.As4(), dst.Addr().As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
		udp := f[34:]
		binary.BigEndian.PutUint16(udp[0:], uint16(10000+i))
		binary.BigEndian.PutUint16(udp[2:], dst.Port())
		binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
		copy(udp[8:], "proxykit-bench")
		out[i] = f
	}
	return out
}

// ipChecksum is the Internet checksum of an IPv4 header whose checksum
// field is zero.
func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// readCounters reads the interface counters of refs, each in its
// namespace.
func readCounters(refs []counterRef) (map[string]ifCounters, error) {
	out := map[string]ifCounters{}
	for _, r := range refs {
		ns, err := netns.Open(r.NetNS)
		if err != nil {
			return nil, err
		}
		var c ifCounters
		err = ns.Do(func() error {
			var err error
			c, err = netDevCounters(r.Device)
			return err
		})
		ns.Close()
		if err != nil {
			return nil, fmt.Errorf("counters of %s: %w", r.Name, err)
		}
		out[r.Name] = c
	}
	return out, nil
}

// netDevCounters reads an interface's counters from /proc/net/dev of the
// calling thread's network namespace.
func netDevCounters(device string) (ifCounters, error) {
	b, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return ifCounters{}, err
	}
	for l := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) != device {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 12 {
			break
		}
		v := func(i int) uint64 { n, _ := strconv.ParseUint(f[i], 10, 64); return n }
		// rx: bytes packets errs drop fifo frame compressed multicast;
		// tx: bytes packets errs drop ...
		return ifCounters{RxPackets: v(1), RxDropped: v(3), TxPackets: v(9), TxDropped: v(11)}, nil
	}
	return ifCounters{}, fmt.Errorf("no interface %s in /proc/net/dev", device)
}
