package proxiertest

import (
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// sticks requires every reply to come from one server and returns it.
func (e *env) sticks(from *testnet.Host, d dest, replies []testnet.Reply) string {
	e.t.Helper()
	c := countServers(replies)
	if len(c) > 1 {
		e.t.Errorf("%s -> %s with session affinity reached several endpoints: %s", from.Name, d, describe(c))
	}
	if len(replies) == 0 {
		return ""
	}
	return replies[0].Server
}

// affinitySticks: with sessionAffinity ClientIP, every connection of one
// client reaches the same endpoint: from the node, from a pod, and from
// outside through a node port.
func affinitySticks(e *env) {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	svc := e.service("sticky", affinity(10800), nodePorts(30086))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p12), ready(p21)))
	e.start()
	for _, x := range []struct {
		from *testnet.Host
		d    dest
	}{
		{e.node1(), tcpTo(e.clusterIP(svc, 80))},
		{&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80))},
		{e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30086))},
	} {
		e.sticks(x.from, x.d, e.answers(x.from, x.d, 8080, 30, p11, p12, p21))
	}
}

// affinityTimeout: with a 2 s affinity timeout, a client sticks to its
// endpoint while it keeps connecting, and after 2 s of silence may land
// elsewhere: with 5 endpoints it must move within 6 such pauses (the odds
// of staying by chance are 1 in 15625).
func affinityTimeout(e *env) {
	pods := append(append([]*testnet.Pod(nil), e.tn.Node1.Pods...), e.tn.Node2.Pods...)
	var eps []ep
	for _, p := range pods {
		eps = append(eps, ready(p))
	}
	const timeout = 2
	svc := e.service("sticky", affinity(timeout))
	e.apply(svc, e.slicesFor(svc, eps...))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	first := e.sticks(e.node1(), d, e.answers(e.node1(), d, 8080, 5, pods...))
	if first == "" {
		return
	}
	for round := 1; round <= 6; round++ {
		time.Sleep(timeout*time.Second + time.Second)
		now := e.sticks(e.node1(), d, e.answers(e.node1(), d, 8080, 5, pods...))
		if now == "" || e.t.Failed() {
			return
		}
		if now != first {
			e.t.Logf("moved from %s to %s after %d pauses", first, now, round)
			return
		}
	}
	e.t.Errorf("%s -> %s stayed on %s across 6 pauses longer than the %ds affinity timeout", e.node1().Name, d, first, timeout)
}

// affinityTurnedOff: after sessionAffinity goes back to None, connections
// spread over all endpoints again.
func affinityTurnedOff(e *env) {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	svc := e.service("sticky", affinity(10800))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p12), ready(p21)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	e.sticks(e.node1(), d, e.answers(e.node1(), d, 8080, 10, p11, p12, p21))
	e.apply(e.service("sticky", affinity(0)))
	e.reaches(e.node1(), d, 8080, 40, p11, p12, p21)
}
