package proxiertest

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func addrPort(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// clientNet is the client's network, of the case's family.
func (e *env) clientNet() netip.Prefix {
	bits := 24
	if e.fam == model.IPv6 {
		bits = 64
	}
	return netip.PrefixFrom(e.client().IP(e.fam), bits).Masked()
}

// nodeNet is the network between the nodes, of the case's family: a
// range the client is not in.
func (e *env) nodeNet() netip.Prefix {
	bits := 24
	if e.fam == model.IPv6 {
		bits = 64
	}
	return netip.PrefixFrom(e.tn.Node1.IP(e.fam), bits).Masked()
}

// nodePortFromClient: TCP, UDP and SCTP node ports answer on node1's
// address toward the client, reaching local and remote endpoints.
func nodePortFromClient(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("np", ports(tcpPort("tcp", 80, 8080), udpPort("udp", 53, 8081), sctpPort("sctp", 7777, 8082)), nodePorts(30080, 30053, 30077))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	ext := e.tn.Node1.ExternalIP(e.fam)
	e.reaches(e.client(), tcpTo(addrPort(ext, 30080)), 8080, 20, p11, p21)
	e.reaches(e.client(), udpTo(addrPort(ext, 30053)), 8081, 20, p11, p21)
	e.answers(e.client(), sctpTo(addrPort(ext, 30077)), 8082, 5, p11, p21)
}

// nodePortFromNode: the node reaches a node port on its own addresses.
func nodePortFromNode(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("np", nodePorts(30080))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.reaches(e.node1(), tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30080)), 8080, 20, p11, p21)
	e.answers(e.node1(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30080)), 8080, 5, p11, p21)
}

// loopbackOf is the loopback address of the case's family.
func (e *env) loopbackOf() netip.Addr {
	if e.fam == model.IPv6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// nodePortLocalhost: a node port on the node's loopback address is served
// (masqueraded) where kube-proxy serves it, IPv4 with localhost node ports
// (iptables mode), and otherwise left to the node's own sockets, where
// nothing listens: refused. Node addresses keep working.
func nodePortLocalhost(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("np", nodePorts(30088))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.localhostNodePort(addrPort(e.loopbackOf(), 30088), p11, p21)
	e.answers(e.node1(), tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30088)), 8080, 3, p11, p21)
}

// localhostNodePort checks the node's connections to a node port on a
// loopback address.
func (e *env) localhostNodePort(d netip.AddrPort, pods ...*testnet.Pod) {
	e.t.Helper()
	if e.opts.LocalhostNodePorts && e.fam == model.IPv4 {
		e.answers(e.node1(), tcpTo(d), 8080, 3, pods...)
		return
	}
	e.rejected(e.node1(), tcpTo(d))
}

// nodePortLoopbackAddresses: loopback ranges in nodePortAddresses open no
// node port on loopback (kube-proxy skips them), except IPv4 with
// localhost node ports, while the node's own address in the list works.
func nodePortLoopbackAddresses(e *env) {
	e.configure = func(c *proxier.Config) {
		c.NodePortAddresses = []netip.Prefix{
			netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
			netip.PrefixFrom(e.tn.Node1.IP(e.fam), e.tn.Node1.IP(e.fam).BitLen()),
		}
	}
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("np", nodePorts(30089))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.localhostNodePort(addrPort(e.loopbackOf(), 30089), p11, p21)
	e.answers(e.node1(), tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30089)), 8080, 3, p11, p21)
	e.answers(&e.pod(1, 3).Host, tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30089)), 8080, 3, p11, p21)
}

// nodePortFromPod: a pod reaches a node port on its node's address.
func nodePortFromPod(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("np", nodePorts(30080))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.reaches(&e.pod(1, 3).Host, tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30080)), 8080, 20, p11, p21)
}

// externalIPCase: an external IP routed to the node answers from w.
func externalIPCase(w fromWhere) func(*env) {
	return func(e *env) {
		p11, p21 := e.pod(1, 1), e.pod(2, 1)
		svc := e.service("ext", externalIPs(0))
		e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
		e.start()
		e.reaches(e.from(w), tcpTo(e.externalIP(svc, 80)), 8080, 20, p11, p21)
	}
}

// loadBalancerIPCase: a load-balancer ingress IP (ipMode VIP) answers
// from w.
func loadBalancerIPCase(w fromWhere) func(*env) {
	return func(e *env) {
		p11, p21 := e.pod(1, 1), e.pod(2, 1)
		svc := e.service("lb", loadBalancer([]int32{30081}, 0))
		e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
		e.start()
		e.reaches(e.from(w), tcpTo(e.lbIP(svc, 0, 80)), 8080, 20, p11, p21)
	}
}

// loadBalancerProxyMode: an ingress IP with ipMode Proxy is left to the
// load balancer: the proxier does not capture it, while the service's VIP
// ingress IP works.
func loadBalancerProxyMode(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("lb", loadBalancerModes([]int32{30081}, []int{0, 1}, []v1.LoadBalancerIPMode{v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy}))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.answers(e.client(), tcpTo(e.lbIP(svc, 0, 80)), 8080, 5, p11, p21)
	e.unanswered(e.client(), tcpTo(e.lbIP(svc, 1, 80)))
}

// sourceRangesAllow: a client inside loadBalancerSourceRanges reaches
// the load-balancer IP.
func sourceRangesAllow(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("lb", loadBalancer([]int32{30081}, 0), sourceRanges(e.nodeNet(), e.clientNet()))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.reaches(e.client(), tcpTo(e.lbIP(svc, 0, 80)), 8080, 20, p11, p21)
}

// sourceRangesDeny: a client outside loadBalancerSourceRanges does not
// reach the load-balancer IP; once the ranges include it, it does.
func sourceRangesDeny(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("lb", loadBalancer([]int32{30081}, 0), sourceRanges(e.nodeNet()))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.unanswered(e.client(), tcpTo(e.lbIP(svc, 0, 80)))
	e.apply(e.service("lb", loadBalancer([]int32{30081}, 0), sourceRanges(e.nodeNet(), e.clientNet())))
	e.answers(e.client(), tcpTo(e.lbIP(svc, 0, 80)), 8080, 5, p11, p21)
}

// sourceRangesNode: loadBalancerSourceRanges apply to the node's own
// traffic too, as in kube-proxy: outside the ranges it is dropped, and
// once the ranges hold the node's addresses it passes.
func sourceRangesNode(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("lb", loadBalancer([]int32{30081}, 0), sourceRanges(e.clientNet()))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.silent(e.node1(), tcpTo(e.lbIP(svc, 0, 80)))
	e.answers(e.client(), tcpTo(e.lbIP(svc, 0, 80)), 8080, 3, p11, p21)
	// node1 reaches the VIP from its address toward the uplink, where
	// its default route points.
	uplink := netip.PrefixFrom(e.tn.Node1.UplinkIP(e.fam), e.clientNet().Bits()).Masked()
	e.apply(e.service("lb", loadBalancer([]int32{30081}, 0), sourceRanges(e.nodeNet(), uplink, e.clientNet())))
	e.answers(e.node1(), tcpTo(e.lbIP(svc, 0, 80)), 8080, 3, p11, p21)
}
