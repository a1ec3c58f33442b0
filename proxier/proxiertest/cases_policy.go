package proxiertest

import "github.com/proxykit/proxykit/proxier"

// externalLocalSource: with externalTrafficPolicy Local, node port and
// load-balancer traffic reaches only the node's own endpoint, and the pod
// sees the client's real address.
func externalLocalSource(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("local", loadBalancer([]int32{30082}, 0), externalLocal(30999))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	for _, d := range []dest{
		tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30082)),
		tcpTo(e.lbIP(svc, 0, 80)),
	} {
		replies := e.answers(e.client(), d, 8080, 20, p11)
		e.sawSource(e.client(), d, replies, e.client().IP(e.fam), "externalTrafficPolicy Local keeps the client's address")
	}
}

// externalLocalDrops: with externalTrafficPolicy Local and no endpoint on
// this node, external traffic is dropped (not rejected: a load balancer
// must see this node as failing, not as refusing); cluster traffic still
// reaches the remote endpoint.
func externalLocalDrops(e *env) {
	p21 := e.pod(2, 1)
	svc := e.service("local", loadBalancer([]int32{30083}, 0), externalLocal(30998))
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	e.silent(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30083)))
	e.silent(e.client(), tcpTo(e.lbIP(svc, 0, 80)))
	e.answers(&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80)), 8080, 5, p21)
}

// externalLocalInCluster: with externalTrafficPolicy Local and no
// endpoint on this node, pods and the node itself still reach the
// service's external addresses (node port, external IP, load-balancer
// IP) through its cluster-wide endpoints, as kube-proxy sends them: a
// pod keeps its address, the node's own traffic is masqueraded. Only
// traffic from outside is held to the (missing) local endpoints and
// dropped.
func externalLocalInCluster(e *env) {
	p21 := e.pod(2, 1)
	pod := &e.pod(1, 3).Host
	svc := e.service("local", loadBalancer([]int32{30086}, 0), externalIPs(0), externalLocal(30997))
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	for _, d := range []dest{
		tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30086)),
		tcpTo(e.externalIP(svc, 80)),
		tcpTo(e.lbIP(svc, 0, 80)),
	} {
		r := e.answers(pod, d, 8080, 3, p21)
		e.sawSource(pod, d, r, pod.IP(e.fam), "a pod's traffic to a Local service's external address goes to all endpoints, not masqueraded")
		r = e.answers(e.node1(), d, 8080, 3, p21)
		e.sawSource(e.node1(), d, r, e.tn.Node1.IP(e.fam), "the node's traffic to a Local service's external address goes to all endpoints, masqueraded")
	}
	if !e.opts.NodeOnly {
		e.silent(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30086)))
		e.silent(e.client(), tcpTo(e.lbIP(svc, 0, 80)))
	}
}

// bothLocalInCluster: with both traffic policies Local and no endpoint on
// this node, cluster IP traffic is dropped (internal policy), while pods
// and the node still reach the external addresses through the
// cluster-wide endpoints, as kube-proxy sends them; with an endpoint on
// this node they reach both.
func bothLocalInCluster(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	pod := &e.pod(1, 3).Host
	svc := e.service("local", loadBalancer([]int32{30079}, 0), externalLocal(30995), internalLocal())
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	e.silent(pod, tcpTo(e.clusterIP(svc, 80)))
	lb, np := tcpTo(e.lbIP(svc, 0, 80)), tcpTo(addrPort(e.tn.Node1.IP(e.fam), 30079))
	for _, d := range []dest{lb, np} {
		r := e.answers(pod, d, 8080, 3, p21)
		e.sawSource(pod, d, r, pod.IP(e.fam), "a pod's traffic to a Local service's external address is not masqueraded")
		e.answers(e.node1(), d, 8080, 3, p21)
	}
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.reaches(pod, tcpTo(e.clusterIP(svc, 80)), 8080, 10, p11)
	e.reaches(pod, lb, 8080, 20, p11, p21)
}

// internalLocalCase: with internalTrafficPolicy Local, cluster IP traffic
// from the node and from its pods reaches only the node's endpoints,
// while node port traffic from outside (policy Cluster) reaches all.
func internalLocalCase(e *env) {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	svc := e.service("itp", internalLocal(), nodePorts(30084))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p12), ready(p21)))
	e.start()
	e.reaches(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p12)
	e.reaches(&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p12)
	e.reaches(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30084)), 8080, 30, p11, p12, p21)
}

// internalLocalDrops: with internalTrafficPolicy Local and no endpoint
// on this node, cluster IP traffic is dropped, while node port traffic
// from outside (policy Cluster) still reaches the remote endpoint; once
// the policy is back to Cluster, cluster IP traffic reaches it too.
func internalLocalDrops(e *env) {
	p21 := e.pod(2, 1)
	svc := e.service("itp", internalLocal(), nodePorts(30084))
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	e.answers(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30084)), 8080, 3, p21)
	e.silent(&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80)))
	e.silent(e.node1(), tcpTo(e.clusterIP(svc, 80)))
	e.apply(e.service("itp", nodePorts(30084)))
	e.answers(&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80)), 8080, 3, p21)
}

// masqExternalToRemote: traffic from outside the cluster to a remote
// endpoint (node port and external IP, policy Cluster) is masqueraded:
// the pod sees node1's address toward node2, so its answer returns
// through node1.
func masqExternalToRemote(e *env) {
	p21 := e.pod(2, 1)
	svc := e.service("masq", nodePorts(30085), externalIPs(0))
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	for _, d := range []dest{
		tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30085)),
		tcpTo(e.externalIP(svc, 80)),
	} {
		replies := e.answers(e.client(), d, 8080, 5, p21)
		e.sawSource(e.client(), d, replies, e.tn.Node1.IP(e.fam), "traffic from outside the cluster CIDRs is masqueraded")
	}
}

// masqNodeToRemote: the node's own traffic to a cluster IP comes from an
// address outside the cluster CIDRs (its uplink address), so it is
// masqueraded on its way to a remote endpoint.
func masqNodeToRemote(e *env) {
	p21 := e.pod(2, 1)
	svc := e.service("masq")
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	replies := e.answers(e.node1(), d, 8080, 5, p21)
	e.sawSource(e.node1(), d, replies, e.tn.Node1.IP(e.fam), "the node's traffic comes from outside the cluster CIDRs and is masqueraded")
}

// masqAllClusterIPsOnly: with MasqueradeAll (kube-proxy's
// --masquerade-all), traffic to cluster IPs is masqueraded, from pods
// too, but a pod's traffic to a Local service's external addresses,
// which goes to the cluster-wide endpoints, keeps the pod's address (as
// kube-proxy matches masqueradeAll by cluster IP destination).
func masqAllClusterIPsOnly(e *env) {
	e.configure = func(c *proxier.Config) { c.MasqueradeAll = true }
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	pod := &e.pod(1, 3).Host
	svc := e.service("local", loadBalancer([]int32{30087}, 0), externalLocal(30996))
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	r := e.answers(pod, d, 8080, 3, p21)
	e.sawSource(pod, d, r, e.tn.Node1.IP(e.fam), "masqueradeAll masquerades cluster IP traffic")
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	d = tcpTo(e.lbIP(svc, 0, 80))
	r = e.answers(pod, d, 8080, 6, p11, p21)
	e.sawSource(pod, d, r, pod.IP(e.fam), "masqueradeAll masquerades by cluster IP destination only")
}

// masqPodKeepsSource: pod-to-service traffic keeps the pod's address,
// to a local and to a remote endpoint.
func masqPodKeepsSource(e *env) {
	p11, p21, p13 := e.pod(1, 1), e.pod(2, 1), e.pod(1, 3)
	svc := e.service("keep")
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	d := tcpTo(e.clusterIP(svc, 80))
	replies := e.answers(&p13.Host, d, 8080, 20, p11, p21)
	if c := countServers(replies); len(replies) == 20 && (c[p11.Name] == 0 || c[p21.Name] == 0) {
		e.t.Errorf("20 connections did not reach both endpoints: %s", describe(c))
	}
	e.sawSource(&p13.Host, d, replies, p13.IP(e.fam), "pod-to-service traffic is not masqueraded")
}

// hairpin: a pod reaches itself through its own service, over TCP and
// UDP (the node must masquerade, or the answer would bypass it).
func hairpin(e *env) {
	p11 := e.pod(1, 1)
	svc := e.service("hairpin", ports(tcpPort("tcp", 80, 8080), udpPort("udp", 53, 8081)))
	e.apply(svc, e.slicesFor(svc, ready(p11)))
	e.start()
	e.answers(&p11.Host, tcpTo(e.clusterIP(svc, 80)), 8080, 5, p11)
	e.answers(&p11.Host, udpTo(e.clusterIP(svc, 53)), 8081, 5, p11)
}
