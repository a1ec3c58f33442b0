package proxiertest

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// protoPorts are the service port used per protocol: port -> target.
var protoPorts = map[string]v1.ServicePort{
	"tcp":  tcpPort("tcp", 80, 8080),
	"udp":  udpPort("udp", 53, 8081),
	"sctp": sctpPort("sctp", 7777, 8082),
}

func dst(proto string, a netip.AddrPort) dest { return dest{proto, a} }

// clusterIPCase: a cluster IP with one local and one remote endpoint
// answers over proto, from the node or from a pod, and both endpoints are
// used.
func clusterIPCase(proto string, fromPodNS bool) func(*env) {
	return func(e *env) {
		sp := protoPorts[proto]
		p11, p21 := e.pod(1, 1), e.pod(2, 1)
		svc := e.service("svc", ports(sp))
		e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
		e.start()
		from := e.node1()
		if fromPodNS {
			from = &e.pod(1, 3).Host
		}
		e.reaches(from, dst(proto, e.clusterIP(svc, uint16(sp.Port))), uint16(sp.TargetPort.IntVal), 20, p11, p21)
	}
}

// multiPort: each port of a service with several (two TCP, one UDP)
// reaches its own target port; a port the service lacks gets no answer.
func multiPort(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("multi", ports(tcpPort("a", 80, 8080), tcpPort("b", 81, 8081), udpPort("c", 82, 8082)))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.answers(from, tcpTo(e.clusterIP(svc, 80)), 8080, 5, p11, p21)
	e.answers(from, tcpTo(e.clusterIP(svc, 81)), 8081, 5, p11, p21)
	e.answers(from, udpTo(e.clusterIP(svc, 82)), 8082, 5, p11, p21)
	e.unanswered(from, tcpTo(e.clusterIP(svc, 83)))
	e.unanswered(from, udpTo(e.clusterIP(svc, 80)))
}

// samePortTwoProtocols: port 53 over TCP and over UDP are two service
// ports with different target ports, and each protocol reaches its own.
func samePortTwoProtocols(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("dns", ports(tcpPort("dns-tcp", 53, 8080), udpPort("dns-udp", 53, 8081)))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	e.answers(from, tcpTo(e.clusterIP(svc, 53)), 8080, 10, p11, p21)
	e.answers(from, udpTo(e.clusterIP(svc, 53)), 8081, 10, p11, p21)
}

// serviceAddedAndDeleted: a proxier started with nothing picks up a
// service added later, and stops serving it once it is deleted.
func serviceAddedAndDeleted(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	e.start()
	svc := e.service("late")
	sl := e.slicesFor(svc, ready(p11), ready(p21))
	e.apply(svc, sl)
	e.reaches(from, tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
	e.remove(svc, sl)
	e.unanswered(from, tcpTo(e.clusterIP(svc, 80)))
	e.unanswered(e.node1(), tcpTo(e.clusterIP(svc, 80)))
}

// servicePortChanged: changing a service's port and target port moves
// the traffic: the new port answers on the new target, the old port no
// longer answers.
func servicePortChanged(e *env) {
	p11, from := e.pod(1, 1), &e.pod(1, 3).Host
	svc := e.service("web")
	e.apply(svc, e.slicesFor(svc, ready(p11)))
	e.start()
	e.answers(from, tcpTo(e.clusterIP(svc, 80)), 8080, 3, p11)
	svc = e.service("web", ports(tcpPort("http", 81, 8081)))
	e.apply(svc, e.slicesFor(svc, ready(p11)))
	e.answers(from, tcpTo(e.clusterIP(svc, 81)), 8081, 3, p11)
	e.unanswered(from, tcpTo(e.clusterIP(svc, 80)))
}

// dualStack: one proxier programs both families: a dual-stack service
// answers on its IPv4 and IPv6 cluster IPs and node ports.
func dualStack(e *env) {
	p11, p21, from := e.pod(1, 1), e.pod(2, 1), &e.pod(1, 3).Host
	svc := e.service("dual", ports(tcpPort("http", 80, 8080), udpPort("dns", 53, 8081)), nodePorts(30091, 30092))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		e.fam = f
		e.reaches(from, tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
		e.reaches(from, udpTo(e.clusterIP(svc, 53)), 8081, 20, p11, p21)
		e.reaches(e.client(), tcpTo(netip.AddrPortFrom(e.tn.Node1.ExternalIP(f), 30091)), 8080, 20, p11, p21)
	}
	e.fam = model.IPv4
}

// fromWhere says where a probe starts.
type fromWhere int

const (
	fromClient fromWhere = iota
	fromNode
	fromPod
)

func (e *env) from(w fromWhere) *testnet.Host {
	switch w {
	case fromNode:
		return e.node1()
	case fromPod:
		return &e.pod(1, 3).Host
	}
	return e.client()
}

// conflictFirstOwnerKeeps: a service whose external IP is another
// service's cluster IP (same port and protocol) does not take that
// address over, whatever its name; once the owner is deleted, it is
// served.
func conflictFirstOwnerKeeps(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	owner := e.service("owner")
	e.apply(owner, e.slicesFor(owner, ready(p11)))
	e.start()
	from := &e.pod(1, 3).Host
	addr := e.clusterIP(owner, 80)
	hijack := e.service("a-hijack", func(_ *env, s *v1.Service) {
		s.Spec.ExternalIPs = []string{addr.Addr().String()}
	})
	e.apply(hijack, e.slicesFor(hijack, ready(p21)))
	e.answers(from, tcpTo(addr), 8080, 10, p11)
	e.answers(e.node1(), tcpTo(addr), 8080, 5, p11)
	e.remove(owner)
	e.answers(from, tcpTo(addr), 8080, 10, p21)
}

// serviceCIDRUnallocated: once the proxier knows the service CIDRs, a
// new connection to an address in them that no service holds is dropped
// where kube-proxy's nftables mode drops it (Options.ServiceCIDRs);
// kube-proxy's iptables and ipvs modes route it on like any address. To
// tell a drop from a packet routed into nowhere, the unallocated address
// is made a real one: node1 routes it to a pod, which has it too.
func serviceCIDRUnallocated(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("in-range")
	e.apply(svc, e.slicesFor(svc, ready(p21)))
	e.start()
	free := addrPlus(clusterIPBase[e.fam], 200)
	bits := 16
	if e.fam == model.IPv6 {
		bits = 64
	}
	cidr := netip.PrefixFrom(clusterIPBase[e.fam], bits).Masked()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host := fmt.Sprintf("%s/%d", free, free.BitLen())
	if out, err := p11.Exec(ctx, "ip", "addr", "add", host, "dev", "eth0", "nodad"); err != nil {
		e.t.Fatalf("%s: ip addr add %s: %v %s", p11.Name, host, err, out)
	}
	if out, err := e.tn.Node1.Exec(ctx, "ip", "route", "add", host, "via", p11.IP(e.fam).String()); err != nil {
		e.t.Fatalf("node1: ip route add %s: %v %s", host, err, out)
	}
	client := &e.pod(1, 3).Host
	d := tcpTo(addrPort(free, 8080))
	e.answers(client, d, 8080, 1, p11)
	e.answers(e.node1(), d, 8080, 1, p11)

	e.cur.p.OnServiceCIDRsChanged([]netip.Prefix{cidr})
	e.flush()
	if e.opts.ServiceCIDRs {
		e.silent(client, d)
		e.silent(e.node1(), d)
	} else {
		e.answers(client, d, 8080, 1, p11)
		e.answers(e.node1(), d, 8080, 1, p11)
	}
	// Services in the range keep working, from pods and the node.
	e.answers(client, tcpTo(e.clusterIP(svc, 80)), 8080, 3, p21)
	e.answers(e.node1(), tcpTo(e.clusterIP(svc, 80)), 8080, 3, p21)
}
