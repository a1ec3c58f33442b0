package proxiertest

import (
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
)

// topologyZoneHints: when every endpoint has zone hints, node1 (zone-a)
// uses the endpoints hinted for zone-a, wherever they run; after node1's
// zone label changes to zone-b, it uses those hinted for zone-b.
func topologyZoneHints(e *env) {
	p11, p21, p22 := e.pod(1, 1), e.pod(2, 1), e.pod(2, 2)
	svc := e.service("zoned")
	e.apply(svc, e.slicesFor(svc, ready(p11).hints(zoneA), ready(p21).hints(zoneA), ready(p22).hints(zoneB)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	e.reaches(e.node1(), d, 8080, 20, p11, p21)
	e.reaches(&e.pod(1, 3).Host, d, 8080, 20, p11, p21)
	n := e.nodeObject()
	n.Labels[v1.LabelTopologyZone] = zoneB
	e.apply(n)
	e.answers(e.node1(), d, 8080, 10, p22)
}

// topologyNodeHints: with trafficDistribution PreferSameNode and node
// hints (as the EndpointSlice controller sets them), node1 uses only the
// endpoints hinted for node1, though another one is in its zone.
func topologyNodeHints(e *env) {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	svc := e.service("samenode", distribution(v1.ServiceTrafficDistributionPreferSameNode))
	e.apply(svc, e.slicesFor(svc,
		ready(p11).hints(zoneA).nodeHint(testnet.Node1Name),
		ready(p12).hints(zoneA).nodeHint(testnet.Node1Name),
		ready(p21).inZone(zoneA).hints(zoneA).nodeHint(testnet.Node2Name)))
	e.start()
	e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p12)
}

// topologyPreferSameZone: with trafficDistribution PreferSameZone and
// the zone hints the EndpointSlice controller derives from it, node1 uses
// the endpoints of its zone.
func topologyPreferSameZone(e *env) {
	p11, p21, p22 := e.pod(1, 1), e.pod(2, 1), e.pod(2, 2)
	svc := e.service("samezone", distribution(v1.ServiceTrafficDistributionPreferSameZone))
	e.apply(svc, e.slicesFor(svc,
		ready(p11).hints(zoneA),
		ready(p21).inZone(zoneA).hints(zoneA),
		ready(p22).hints(zoneB)))
	e.start()
	e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
}

// topologyIncompleteHints: when some ready endpoint lacks hints, hints
// are ignored and every endpoint is used.
func topologyIncompleteHints(e *env) {
	p11, p21, p22 := e.pod(1, 1), e.pod(2, 1), e.pod(2, 2)
	svc := e.service("partial")
	e.apply(svc, e.slicesFor(svc, ready(p11).hints(zoneA), ready(p21).hints(zoneB), ready(p22)))
	e.start()
	e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 30, p11, p21, p22)
}

// topologyNoHintForZone: when no endpoint is hinted for node1's zone,
// hints are ignored and every endpoint is used.
func topologyNoHintForZone(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("elsewhere")
	e.apply(svc, e.slicesFor(svc, ready(p11).hints(zoneB), ready(p21).hints("zone-c")))
	e.start()
	e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
}
