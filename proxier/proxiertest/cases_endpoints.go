package proxiertest

import (
	"github.com/proxykit/proxykit/internal/testnet"
)

// loadSpread: with 3 endpoints (two local, one remote), 300 new
// connections reach every endpoint, none with fewer than 15%.
func loadSpread(e *env) {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	svc := e.service("spread")
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p12), ready(p21)))
	e.start()
	const n = 300
	counts := e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, n, p11, p12, p21)
	e.t.Logf("%d connections: %s", n, describe(counts))
	for _, p := range []*testnet.Pod{p11, p12, p21} {
		if c := counts[p.Name]; c < n*15/100 {
			e.t.Errorf("%s got %d of %d connections (%s), want at least 15%%", p.Name, c, n, describe(counts))
		}
	}
}

// endpointAdded: new connections reach an endpoint added to the slice.
func endpointAdded(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("grow")
	e.apply(svc, e.slicesFor(svc, ready(p11)))
	e.start()
	e.answers(from, tcpTo(e.clusterIP(svc, 80)), 8080, 5, p11)
	e.apply(e.slicesFor(svc, ready(p11), ready(p21)))
	e.reaches(from, tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
}

// endpointRemoved: new connections no longer reach an endpoint removed
// from the slice (its pod still runs and would answer).
func endpointRemoved(e *env) {
	endpointChanged(e, func(x ep) ep { return x }, true)
}

// endpointNotReady: new connections no longer reach an endpoint turned
// not ready.
func endpointNotReady(e *env) {
	endpointChanged(e, func(x ep) ep { return notReady(x.pod) }, false)
}

// endpointTerminating: new connections no longer reach an endpoint turned
// terminating (still serving) while others are ready.
func endpointTerminating(e *env) {
	endpointChanged(e, func(x ep) ep { return terminating(x.pod, true) }, false)
}

// endpointChanged starts with three ready endpoints and changes
// node1-pod2, with change or by removing it, then checks that new
// connections reach only the other two.
func endpointChanged(e *env, change func(ep) ep, remove bool) {
	p11, p12, p21, from := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("shrink")
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p12), ready(p21)))
	e.start()
	e.reaches(from, tcpTo(e.clusterIP(svc, 80)), 8080, 30, p11, p12, p21)
	eps := []ep{ready(p11), ready(p21)}
	if !remove {
		eps = append(eps, change(ready(p12)))
	}
	e.apply(e.slicesFor(svc, eps...))
	e.reaches(from, tcpTo(e.clusterIP(svc, 80)), 8080, 30, p11, p21)
}

// terminatingFallback: serving terminating endpoints receive traffic
// only when no endpoint is ready; when none serves either, the service
// rejects.
func terminatingFallback(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("fallback")
	e.apply(svc, e.slicesFor(svc, ready(p11), terminating(p21, true)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	e.answers(from, d, 8080, 20, p11)
	e.apply(e.slicesFor(svc, terminating(p11, false), terminating(p21, true)))
	e.answers(from, d, 8080, 10, p21)
	e.apply(e.slicesFor(svc, terminating(p11, false), terminating(p21, false)))
	e.rejected(from, d)
}

// noEndpointsRejects: a service without endpoints (an empty slice, or no
// slice at all) rejects TCP and UDP at once, from the node, from a pod and
// on its node port from outside, the node and a pod, instead of letting
// clients hang.
func noEndpointsRejects(e *env) {
	empty := e.service("empty", ports(tcpPort("tcp", 80, 8080), udpPort("udp", 53, 8081)), nodePorts(30100, 30101))
	noSlice := e.service("noslice")
	e.apply(empty, e.slicesFor(empty), noSlice)
	e.start()
	ext := e.tn.Node1.ExternalIP(e.fam)
	for _, from := range []*testnet.Host{e.node1(), &e.pod(1, 3).Host} {
		e.rejected(from, tcpTo(e.clusterIP(empty, 80)))
		e.rejected(from, udpTo(e.clusterIP(empty, 53)))
		e.rejected(from, tcpTo(e.clusterIP(noSlice, 80)))
		e.rejected(from, tcpTo(addrPort(ext, 30100)))
		e.rejected(from, udpTo(addrPort(ext, 30101)))
	}
	e.rejected(e.client(), tcpTo(addrPort(ext, 30100)))
	e.rejected(e.client(), udpTo(addrPort(ext, 30101)))
}
