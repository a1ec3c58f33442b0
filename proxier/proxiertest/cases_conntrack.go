package proxiertest

import (
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// udpStaleConntrack: a UDP client that keeps its source port (like a DNS
// resolver) follows endpoint changes: when the service gets its first
// endpoint, and when that endpoint is replaced while its pod keeps
// running. The proxier must clear the flow's conntrack entry, or the
// client keeps talking to the old endpoint (or to nothing: the classic
// DNS stall). Checked for a cluster IP from a pod and a node port from
// outside.
func udpStaleConntrack(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("dns", ports(udpPort("dns", 53, 8081)), nodePorts(30053))
	e.apply(svc, e.slicesFor(svc))
	e.start()
	type client struct {
		from *testnet.Host
		s    *testnet.UDPSocket
	}
	var clients []client
	for _, x := range []struct {
		from *testnet.Host
		d    dest
	}{
		{&e.pod(1, 3).Host, udpTo(e.clusterIP(svc, 53))},
		{e.client(), udpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30053))},
	} {
		s, err := x.from.UDPSocket(x.d.addr)
		if err != nil {
			e.t.Fatal(err)
		}
		defer s.Close()
		if r := s.Query(silentTimeout); r.Outcome == testnet.Answered {
			e.t.Errorf("%s -> %s without endpoints: %v", x.from.Name, x.d, r)
		}
		clients = append(clients, client{x.from, s})
	}
	for _, want := range []*testnet.Pod{p11, p21} {
		e.apply(e.slicesFor(svc, ready(want)))
		for _, c := range clients {
			e.queryReaches(c.from, c.s, want)
		}
	}
}

// queryReaches requires the next answer on a UDP socket to come from
// want. A lost datagram (timeout) is retried twice; an answer from
// another server fails at once.
func (e *env) queryReaches(from *testnet.Host, s *testnet.UDPSocket, want *testnet.Pod) {
	e.t.Helper()
	var r testnet.Result
	for range 3 {
		if r = s.Query(silentTimeout); r.Outcome != testnet.TimedOut {
			break
		}
	}
	if r.Outcome != testnet.Answered || r.Server != want.Name {
		e.t.Errorf("%s (UDP from %s): %v; want an answer from %s", from.Name, s.LocalAddr(), r, want.Name)
	}
}

// tcpConnectBeforeService: a client whose first SYN to a cluster IP left
// before the service was programmed gets through once it is. The kernel
// retransmits the SYN (after 1 s, then 3 s) with the same addresses and
// ports; the unanswered, untranslated conntrack entry the first SYN left
// must not capture the retransmissions, or the connection fails until
// that entry times out (120 s). Checked from a pod.
func tcpConnectBeforeService(e *env) {
	p11 := e.pod(1, 1)
	svc := e.service("early", ports(tcpPort("http", 80, 8080)))
	e.start()
	from := &e.pod(1, 3).Host
	to := e.clusterIP(svc, 80)
	done := make(chan testnet.Result, 1)
	go func() { done <- from.TCP(to, 10*time.Second) }()
	time.Sleep(300 * time.Millisecond) // the first SYN has left
	e.apply(svc, e.slicesFor(svc, ready(p11)))
	if r := <-done; r.Outcome != testnet.Answered || r.Server != p11.Name {
		e.t.Errorf("%s -> %s, connecting since before the service existed: %v; want an answer from %s", from.Name, to, r, p11.Name)
	}
}
