package sandbox

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// Outcome is how a probe ended.
type Outcome int

// The outcomes of a probe.
const (
	// Answered: a pod's server answered.
	Answered Outcome = iota
	// Refused: a TCP reset or an ICMP port unreachable, i.e. the packet
	// was rejected.
	Refused
	// Unreachable: an ICMP host or network unreachable or administratively
	// prohibited: rejected too.
	Unreachable
	// Dropped: a netfilter rule of the probing host itself dropped the
	// packet on its way out (EPERM), which is how a drop looks from a
	// node.
	Dropped
	// TimedOut: no answer within the timeout; the packet was dropped
	// silently somewhere.
	TimedOut
	// Failed: anything else; see Result.Err.
	Failed
)

// String returns the outcome's name, e.g. "timed out".
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
	// Outcome says how the probe ended.
	Outcome Outcome
	// Server is the name of the pod that answered, e.g. "node1-pod2".
	// It and the fields below are set when Outcome is [Answered].
	Server string
	Proto  string         // the server's protocol: "tcp", "udp" or "sctp"
	Port   uint16         // the server's local port: a service's target port
	Source netip.AddrPort // the client address the server saw
	// Err is the error behind any outcome but [Answered].
	Err error
	// Elapsed is how long the probe took.
	Elapsed time.Duration
}

// String describes the result in one line.
func (r Result) String() string {
	if r.Outcome == Answered {
		return fmt.Sprintf("answered by %s (%s port %d) seeing source %s after %v", r.Server, r.Proto, r.Port, r.Source, r.Elapsed.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s after %v: %v", r.Outcome, r.Elapsed.Round(time.Millisecond), r.Err)
}

// outcome maps the harness's outcome to the sandbox's.
func outcome(o testnet.Outcome) Outcome {
	switch o {
	case testnet.Answered:
		return Answered
	case testnet.Refused:
		return Refused
	case testnet.Unreachable:
		return Unreachable
	case testnet.Dropped:
		return Dropped
	case testnet.TimedOut:
		return TimedOut
	}
	return Failed
}

func newResult(r testnet.Result) Result {
	res := Result{Outcome: outcome(r.Outcome), Err: r.Err, Elapsed: r.Elapsed}
	if res.Outcome == Answered {
		res.Server, res.Proto, res.Port, res.Source = r.Server, r.Proto, r.Port, r.Source
	}
	return res
}

// TCP opens a TCP connection from the host to dst and reads the server's
// one-line answer, all within timeout. The timeout is part of what is
// measured: a probe that gets no answer in time ends [TimedOut].
func (h *Host) TCP(dst netip.AddrPort, timeout time.Duration) Result {
	return newResult(h.ns.TCP(dst, timeout))
}

// UDP sends one datagram from a new socket of the host to dst and waits
// up to timeout for the answer.
func (h *Host) UDP(dst netip.AddrPort, timeout time.Duration) Result {
	return newResult(h.ns.UDP(dst, timeout))
}

// SCTPInit sends an SCTP INIT chunk from the host to dst, from a random
// source port, and waits up to timeout for a pod of the sandbox to
// receive it. The result names the pod, the port it saw (Port) and the
// source it saw. It checks that the packet was delivered and translated,
// not an SCTP association; the outcome is [Answered], [TimedOut], or
// [Dropped] or [Failed] when sending failed.
func (h *Host) SCTPInit(dst netip.AddrPort, timeout time.Duration) Result {
	return newResult(h.ns.SCTPInit(dst, timeout))
}
