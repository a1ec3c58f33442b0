package proxiertest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// Probe timeouts. An answer on these links takes a millisecond; a timeout
// is what a drop looks like. A rejected TCP connect may take one SYN
// retransmission (a second) to fail: on veth links the ICMP error can
// arrive while connect() still holds the socket, and the kernel then
// ignores it.
const (
	answerTimeout = 3 * time.Second
	silentTimeout = time.Second
	rejectWithin  = 1500 * time.Millisecond
)

// dest is where a probe goes.
type dest struct {
	proto string // "tcp", "udp" or "sctp"
	addr  netip.AddrPort
}

func (d dest) String() string { return d.addr.String() + "/" + d.proto }

func tcpTo(a netip.AddrPort) dest  { return dest{"tcp", a} }
func udpTo(a netip.AddrPort) dest  { return dest{"udp", a} }
func sctpTo(a netip.AddrPort) dest { return dest{"sctp", a} }

func (e *env) probe(from *testnet.Host, d dest, timeout time.Duration) testnet.Result {
	switch d.proto {
	case "tcp":
		return from.TCP(d.addr, timeout)
	case "udp":
		return from.UDP(d.addr, timeout)
	case "sctp":
		return from.SCTPInit(d.addr, timeout)
	}
	panic("proxiertest: unknown protocol " + d.proto)
}

func names(pods []*testnet.Pod) string {
	var n []string
	for _, p := range pods {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

// answeredBy reports whether r is an answer from one of pods on port
// target, and reports a test error if not.
func (e *env) answeredBy(from *testnet.Host, d dest, r testnet.Result, target uint16, pods []*testnet.Pod) bool {
	e.t.Helper()
	ok := r.Outcome == testnet.Answered && r.Port == target && slices.ContainsFunc(pods, func(p *testnet.Pod) bool { return p.Name == r.Server })
	if !ok {
		e.t.Errorf("%s -> %s: %v; want an answer from {%s} on port %d", from.Name, d, r, names(pods), target)
	}
	return ok
}

// answers sends n probes from a host and requires each to be answered by
// one of pods on port target. It stops at the first failure and returns
// the replies it got.
func (e *env) answers(from *testnet.Host, d dest, target uint16, n int, pods ...*testnet.Pod) []testnet.Reply {
	e.t.Helper()
	var out []testnet.Reply
	for range n {
		r := e.probe(from, d, answerTimeout)
		if !e.answeredBy(from, d, r, target, pods) {
			break
		}
		out = append(out, r.Reply)
	}
	return out
}

// reaches is [env.answers] that also requires every pod to have answered
// at least once. It returns the number of answers per pod name.
func (e *env) reaches(from *testnet.Host, d dest, target uint16, n int, pods ...*testnet.Pod) map[string]int {
	e.t.Helper()
	replies := e.answers(from, d, target, n, pods...)
	counts := countServers(replies)
	if len(replies) == n {
		for _, p := range pods {
			if counts[p.Name] == 0 {
				e.t.Errorf("%s -> %s: %d answers never reached %s: %v", from.Name, d, n, p.Name, counts)
			}
		}
	}
	return counts
}

func countServers(replies []testnet.Reply) map[string]int {
	c := map[string]int{}
	for _, r := range replies {
		c[r.Server]++
	}
	return c
}

// sawSource requires every reply to have seen source address want.
func (e *env) sawSource(from *testnet.Host, d dest, replies []testnet.Reply, want netip.Addr, why string) {
	e.t.Helper()
	for _, r := range replies {
		if r.Source.Addr() != want {
			e.t.Errorf("%s -> %s: %s saw source %s, want %s (%s)", from.Name, d, r.Server, r.Source.Addr(), want, why)
			return
		}
	}
}

// silent requires a probe to go unanswered without a reject: a timeout,
// or EPERM when the sender's own namespace drops it.
func (e *env) silent(from *testnet.Host, d dest) {
	e.t.Helper()
	if r := e.probe(from, d, silentTimeout); !r.Outcome.Silent() {
		e.t.Errorf("%s -> %s: %v; want it dropped (no answer, no reject)", from.Name, d, r)
	}
}

// rejected requires a probe to be refused or reported unreachable at
// once, not left to time out.
func (e *env) rejected(from *testnet.Host, d dest) {
	e.t.Helper()
	if r := e.probe(from, d, rejectWithin+500*time.Millisecond); !r.Outcome.Rejected() || r.Elapsed > rejectWithin {
		e.t.Errorf("%s -> %s: %v; want it rejected (refused or unreachable) within %v", from.Name, d, r, rejectWithin)
	}
}

// unanswered requires a probe to get no answer, whether dropped or
// rejected.
func (e *env) unanswered(from *testnet.Host, d dest) {
	e.t.Helper()
	if r := e.probe(from, d, silentTimeout); r.Outcome == testnet.Answered {
		e.t.Errorf("%s -> %s: %v; want no answer", from.Name, d, r)
	}
}

// describe formats counts for a log line.
func describe(counts map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(counts) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}
