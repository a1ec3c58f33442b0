package testnet

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Outcome is how a probe ended.
type Outcome int

// The outcomes of a probe.
const (
	// Answered: a server answered.
	Answered Outcome = iota
	// Refused: ECONNREFUSED, a TCP reset or an ICMP port unreachable,
	// i.e. the packet was rejected.
	Refused
	// Unreachable: EHOSTUNREACH, ENETUNREACH or EACCES, an ICMP host or
	// network unreachable or administratively prohibited: rejected too.
	Unreachable
	// Dropped: EPERM, a netfilter rule of the probing namespace dropped
	// the packet on its way out (how a drop looks from the node itself).
	Dropped
	// TimedOut: no answer within the timeout, the packet was silently
	// dropped somewhere.
	TimedOut
	// Failed: anything else; see Result.Err.
	Failed
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Answered:
		return "answered"
	case Refused:
		return "refused"
	case Unreachable:
		return "unreachable"
	case Dropped:
		return "dropped"
	case TimedOut:
		return "timed out"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Rejected reports whether the packet was actively rejected: [Refused] or
// [Unreachable].
func (o Outcome) Rejected() bool { return o == Refused || o == Unreachable }

// Silent reports whether the packet was dropped without an answer:
// [Dropped] or [TimedOut].
func (o Outcome) Silent() bool { return o == Dropped || o == TimedOut }

// Result is the result of one probe.
type Result struct {
	// Reply is what the server answered; valid when Outcome is Answered.
	Reply
	// Outcome says how the probe ended.
	Outcome Outcome
	// Err is the error behind any other outcome.
	Err error
	// Elapsed is how long the probe took.
	Elapsed time.Duration
}

// String describes the result for a test log.
func (r Result) String() string {
	if r.Outcome == Answered {
		return fmt.Sprintf("answered by %s (%s port %d) seeing source %s after %v", r.Server, r.Proto, r.Port, r.Source, r.Elapsed.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s after %v: %v", r.Outcome, r.Elapsed.Round(time.Millisecond), r.Err)
}

func classify(err error) Outcome {
	var ne net.Error
	switch {
	case err == nil:
		return Answered
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EACCES):
		return Unreachable
	case errors.Is(err, syscall.EPERM):
		return Dropped
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return TimedOut
	}
	return Failed
}

func result(start time.Time, r Reply, err error) Result {
	res := Result{Outcome: classify(err), Err: err, Elapsed: time.Since(start)}
	if err == nil {
		res.Reply = r
	}
	return res
}

func network(proto string, a netip.Addr) string {
	if a.Unmap().Is4() {
		return proto + "4"
	}
	return proto + "6"
}

// TCP opens a TCP connection from the namespace to dst and reads the
// server's one-line answer, all within timeout.
func (n *NS) TCP(dst netip.AddrPort, timeout time.Duration) Result {
	start := time.Now()
	deadline := start.Add(timeout)
	var r Reply
	err := n.Do(func() error {
		d := net.Dialer{Deadline: deadline}
		c, err := d.Dial(network("tcp", dst.Addr()), dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(deadline)
		b, err := io.ReadAll(io.LimitReader(c, 512))
		if err != nil {
			return err
		}
		r, err = ParseReply(string(b))
		return err
	})
	return result(start, r, err)
}

// DialTCP opens a TCP connection from the namespace to dst, e.g. to an
// [EchoPort]. The connection is closed at teardown if the caller has not
// closed it.
func (n *NS) DialTCP(dst netip.AddrPort, timeout time.Duration) (*net.TCPConn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial(network("tcp", dst.Addr()), dst.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	n.track(c)
	return c.(*net.TCPConn), nil
}

// Echo writes one line to an echo server connection and checks that the
// same line comes back within timeout.
func Echo(c net.Conn, line string, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return err
	}
	got, err := bufio.NewReader(io.LimitReader(c, int64(len(line)+1))).ReadString('\n')
	if err != nil {
		return err
	}
	if got = strings.TrimSuffix(got, "\n"); got != line {
		return fmt.Errorf("echo: sent %q, got %q", line, got)
	}
	return nil
}

// UDP sends one datagram from a new socket in the namespace to dst and
// waits up to timeout for the answer.
func (n *NS) UDP(dst netip.AddrPort, timeout time.Duration) Result {
	start := time.Now()
	s, err := n.udpSocket(dst)
	if err != nil {
		return result(start, Reply{}, err)
	}
	defer s.conn.Close()
	return s.query(start, timeout)
}

// UDPSocket is a connected UDP socket in a namespace that keeps its source
// port across queries, as a DNS client does: the conntrack entry of its
// flow outlives endpoint changes unless the proxier clears it.
type UDPSocket struct {
	conn *net.UDPConn
	mu   sync.Mutex
	seq  int
	id   string
}

// UDPSocket opens a UDP socket in the namespace connected to dst. It is
// closed at teardown if the caller has not closed it.
func (n *NS) UDPSocket(dst netip.AddrPort) (*UDPSocket, error) {
	s, err := n.udpSocket(dst)
	if err != nil {
		return nil, err
	}
	n.track(s)
	return s, nil
}

func (n *NS) udpSocket(dst netip.AddrPort) (*UDPSocket, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		c, err = net.DialUDP(network("udp", dst.Addr()), nil, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return nil, err
	}
	var id [4]byte
	rand.Read(id[:])
	return &UDPSocket{conn: c, id: fmt.Sprintf("%x", id)}, nil
}

// LocalAddr returns the socket's source address and port.
func (s *UDPSocket) LocalAddr() netip.AddrPort {
	return unmap(s.conn.LocalAddr().(*net.UDPAddr).AddrPort())
}

// Query sends one datagram and waits up to timeout for its answer;
// answers to earlier datagrams are skipped.
func (s *UDPSocket) Query(timeout time.Duration) Result {
	return s.query(time.Now(), timeout)
}

func (s *UDPSocket) query(start time.Time, timeout time.Duration) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	tok := fmt.Sprintf("%s-%d", s.id, s.seq)
	deadline := start.Add(timeout)
	s.conn.SetDeadline(deadline)
	// A write fails with EPERM when a netfilter rule of this namespace
	// drops the datagram on its way out, which a reject rule does too
	// after sending its ICMP error: wait for that error to tell the two
	// apart.
	_, werr := s.conn.Write([]byte(tok))
	if werr != nil && !errors.Is(werr, syscall.EPERM) {
		return result(start, Reply{}, werr)
	}
	buf := make([]byte, 512)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			if werr != nil && classify(err) == TimedOut {
				err = werr
			}
			return result(start, Reply{}, err)
		}
		r, err := ParseReply(string(buf[:n]))
		if err != nil {
			return result(start, Reply{}, err)
		}
		if r.Token == tok {
			return result(start, r, nil)
		}
	}
}

// Close closes the socket.
func (s *UDPSocket) Close() error { return s.conn.Close() }

// SCTPInit sends a hand-built SCTP INIT chunk from the namespace to dst
// over a raw socket, from a random source port, and waits up to timeout for
// a pod of the topology to receive it. The result names the pod, the
// destination port it saw (Port) and the source it saw. It checks packet
// delivery and NAT, not an SCTP association; the outcome is [Answered],
// [TimedOut], or [Dropped] or [Failed] when sending failed.
func (n *NS) SCTPInit(dst netip.AddrPort, timeout time.Duration) Result {
	start := time.Now()
	var b [6]byte
	rand.Read(b[:])
	tag := binary.BigEndian.Uint32(b[:4]) | 1
	srcPort := 32768 + binary.BigEndian.Uint16(b[4:])%28000
	ch := n.topo.waitSCTP(tag)
	defer n.topo.unwaitSCTP(tag)
	pkt := buildSCTPInit(srcPort, dst.Port(), tag)
	err := n.Do(func() error {
		c, err := net.DialIP(network("ip", dst.Addr())+":132", nil, &net.IPAddr{IP: dst.Addr().AsSlice()})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(pkt)
		return err
	})
	if err != nil {
		return result(start, Reply{}, err)
	}
	t := time.NewTimer(time.Until(start.Add(timeout)))
	defer t.Stop()
	select {
	case r := <-ch:
		return result(start, r, nil)
	case <-t.C:
		return result(start, Reply{}, fmt.Errorf("SCTP INIT %08x to %s: %w", tag, dst, os.ErrDeadlineExceeded))
	}
}

func (t *Topology) waitSCTP(tag uint32) chan Reply {
	ch := make(chan Reply, 1)
	t.sctpMu.Lock()
	t.sctpWaiters[tag] = ch
	t.sctpMu.Unlock()
	return ch
}

func (t *Topology) unwaitSCTP(tag uint32) {
	t.sctpMu.Lock()
	delete(t.sctpWaiters, tag)
	t.sctpMu.Unlock()
}

// deliverSCTP hands an INIT a pod received to the prober waiting for its
// tag; a second delivery of the same tag is ignored.
func (t *Topology) deliverSCTP(tag uint32, r Reply) {
	t.sctpMu.Lock()
	ch := t.sctpWaiters[tag]
	t.sctpMu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- r:
	default:
	}
}
