package proxiertest

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// The namespace of every object the suite creates, and the zones: node1
// and its pods are in zoneA, node2's pods in zoneB unless a case says
// otherwise.
const (
	objNamespace = "proxiertest"
	zoneA        = "zone-a"
	zoneB        = "zone-b"
)

// Address plan of the virtual addresses (the topology's are in
// internal/testnet).
var (
	clusterIPBase = map[model.IPFamily]netip.Addr{model.IPv4: netip.MustParseAddr("10.96.0.10"), model.IPv6: netip.MustParseAddr("fd00:10:96::10")}
	externalBase  = map[model.IPFamily]netip.Addr{model.IPv4: netip.MustParseAddr("203.0.113.10"), model.IPv6: netip.MustParseAddr("2001:db8:ff::10")}
	lbBase        = map[model.IPFamily]netip.Addr{model.IPv4: netip.MustParseAddr("203.0.113.100"), model.IPv6: netip.MustParseAddr("2001:db8:ff::100")}
)

func addrPlus(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

func k8sFamily(f model.IPFamily) v1.IPFamily {
	if f == model.IPv6 {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// svcOpt changes a Service under construction.
type svcOpt func(e *env, s *v1.Service)

// service returns a ClusterIP Service of the case's families with the
// given ports (default: "http" TCP 80 -> 8080), its cluster IPs allocated
// from the service name.
func (e *env) service(name string, opts ...svcOpt) *v1.Service {
	idx, ok := e.ipIdx[name]
	if !ok {
		idx = len(e.ipIdx)
		e.ipIdx[name] = idx
	}
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: objNamespace, Name: name, UID: types.UID("uid-svc-" + name)},
		Spec: v1.ServiceSpec{
			Type:            v1.ServiceTypeClusterIP,
			Ports:           []v1.ServicePort{tcpPort("http", 80, 8080)},
			SessionAffinity: v1.ServiceAffinityNone,
		},
	}
	policy := v1.IPFamilyPolicySingleStack
	if e.dual {
		policy = v1.IPFamilyPolicyRequireDualStack
	}
	s.Spec.IPFamilyPolicy = &policy
	for _, f := range e.families() {
		ip := addrPlus(clusterIPBase[f], idx).String()
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, ip)
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, k8sFamily(f))
	}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	for _, o := range opts {
		o(e, s)
	}
	return s
}

func svcPort(name string, proto v1.Protocol, port, target int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(target)}
}

func tcpPort(name string, port, target int32) v1.ServicePort {
	return svcPort(name, v1.ProtocolTCP, port, target)
}

func udpPort(name string, port, target int32) v1.ServicePort {
	return svcPort(name, v1.ProtocolUDP, port, target)
}

func sctpPort(name string, port, target int32) v1.ServicePort {
	return svcPort(name, v1.ProtocolSCTP, port, target)
}

// ports replaces the service's ports.
func ports(ps ...v1.ServicePort) svcOpt {
	return func(_ *env, s *v1.Service) { s.Spec.Ports = ps }
}

// nodePorts makes the service a NodePort service, giving its ports these
// node ports in order.
func nodePorts(nps ...int32) svcOpt {
	return func(_ *env, s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		for i := range s.Spec.Ports {
			if i < len(nps) {
				s.Spec.Ports[i].NodePort = nps[i]
			}
		}
	}
}

// loadBalancer makes the service a LoadBalancer service with node ports
// nps and status ingress IPs lbBase+idx, each with ipMode VIP unless a
// mode is given for it.
func loadBalancer(nps []int32, idx ...int) svcOpt {
	return loadBalancerModes(nps, idx, nil)
}

func loadBalancerModes(nps []int32, idx []int, modes []v1.LoadBalancerIPMode) svcOpt {
	return func(e *env, s *v1.Service) {
		nodePorts(nps...)(e, s)
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = nil
		for _, f := range e.families() {
			for j, i := range idx {
				mode := v1.LoadBalancerIPModeVIP
				if j < len(modes) {
					mode = modes[j]
				}
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: addrPlus(lbBase[f], i).String(), IPMode: &mode})
			}
		}
	}
}

// externalIPs sets the service's external IPs to externalBase+idx.
func externalIPs(idx ...int) svcOpt {
	return func(e *env, s *v1.Service) {
		s.Spec.ExternalIPs = nil
		for _, f := range e.families() {
			for _, i := range idx {
				s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, addrPlus(externalBase[f], i).String())
			}
		}
	}
}

// sourceRanges sets loadBalancerSourceRanges.
func sourceRanges(prefixes ...netip.Prefix) svcOpt {
	return func(_ *env, s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = nil
		for _, p := range prefixes {
			s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, p.String())
		}
	}
}

// externalLocal sets externalTrafficPolicy Local (and a health check node
// port for a LoadBalancer service).
func externalLocal(healthCheckNodePort int32) svcOpt {
	return func(_ *env, s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		if s.Spec.Type == v1.ServiceTypeLoadBalancer {
			s.Spec.HealthCheckNodePort = healthCheckNodePort
		}
	}
}

// internalLocal sets internalTrafficPolicy Local.
func internalLocal() svcOpt {
	return func(_ *env, s *v1.Service) {
		p := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
}

// affinity sets sessionAffinity ClientIP with a timeout in seconds, or
// None when seconds is 0.
func affinity(seconds int32) svcOpt {
	return func(_ *env, s *v1.Service) {
		if seconds == 0 {
			s.Spec.SessionAffinity = v1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = nil
			return
		}
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &seconds}}
	}
}

// distribution sets spec.trafficDistribution.
func distribution(d string) svcOpt {
	return func(_ *env, s *v1.Service) { s.Spec.TrafficDistribution = &d }
}

// ep describes an endpoint independently of the IP family.
type ep struct {
	pod                         *testnet.Pod
	ready, serving, terminating bool
	zone                        string
	zoneHints, nodeHints        []string
}

// ready returns a ready endpoint on p, in its node's default zone.
func ready(p *testnet.Pod) ep {
	z := zoneA
	if p.Node.Name != testnet.Node1Name {
		z = zoneB
	}
	return ep{pod: p, ready: true, serving: true, zone: z}
}

// notReady returns an endpoint on p that is neither ready nor
// terminating (e.g. failing its readiness probe).
func notReady(p *testnet.Pod) ep {
	x := ready(p)
	x.ready, x.serving = false, false
	return x
}

// terminating returns a terminating endpoint on p, still serving or not.
func terminating(p *testnet.Pod, serving bool) ep {
	x := ready(p)
	x.ready, x.serving, x.terminating = false, serving, true
	return x
}

// inZone returns x in zone z.
func (x ep) inZone(z string) ep { x.zone = z; return x }

// hints returns x with hints for the given zones.
func (x ep) hints(zones ...string) ep { x.zoneHints = zones; return x }

// nodeHint returns x with hints for the given nodes.
func (x ep) nodeHint(nodes ...string) ep { x.nodeHints = nodes; return x }

// slicesFor returns the service's EndpointSlices, one per family of the
// case, holding eps with the service's target ports.
func (e *env) slicesFor(s *v1.Service, eps ...ep) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, f := range e.families() {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: objNamespace,
				Name:      s.Name + "-" + strings.ToLower(f.String()),
				UID:       types.UID(fmt.Sprintf("uid-slice-%s-%s", s.Name, f)),
				Labels: map[string]string{
					discoveryv1.LabelServiceName: s.Name,
					discoveryv1.LabelManagedBy:   "proxiertest",
				},
			},
			AddressType: discoveryv1.AddressType(k8sFamily(f)),
		}
		for _, sp := range s.Spec.Ports {
			name, proto, port := sp.Name, sp.Protocol, sp.TargetPort.IntVal
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, x := range eps {
			nodeName, zone := x.pod.Node.Name, x.zone
			rdy, srv, term := x.ready, x.serving, x.terminating
			d := discoveryv1.Endpoint{
				Addresses:  []string{x.pod.IP(f).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &rdy, Serving: &srv, Terminating: &term},
				NodeName:   &nodeName,
				Zone:       &zone,
				TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: objNamespace, Name: x.pod.Name},
			}
			if x.zoneHints != nil || x.nodeHints != nil {
				d.Hints = &discoveryv1.EndpointHints{}
				for _, z := range x.zoneHints {
					d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
				}
				for _, n := range x.nodeHints {
					d.Hints.ForNodes = append(d.Hints.ForNodes, discoveryv1.ForNode{Name: n})
				}
			}
			sl.Endpoints = append(sl.Endpoints, d)
		}
		out = append(out, sl)
	}
	return out
}

// nodeObject is node1 as the API server would show it, in zoneA.
func (e *env) nodeObject() *v1.Node {
	n1 := e.tn.Node1
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: testnet.Node1Name,
			UID:  "uid-node1",
			Labels: map[string]string{
				v1.LabelHostname:      testnet.Node1Name,
				v1.LabelTopologyZone:  zoneA,
				v1.LabelOSStable:      "linux",
				"proxiertest/purpose": "conformance",
			},
		},
		Spec: v1.NodeSpec{PodCIDR: n1.PodCIDRv4.String(), PodCIDRs: []string{n1.PodCIDRv4.String(), n1.PodCIDRv6.String()}},
	}
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		n.Status.Addresses = append(n.Status.Addresses,
			v1.NodeAddress{Type: v1.NodeInternalIP, Address: n1.IP(f).String()},
			v1.NodeAddress{Type: v1.NodeExternalIP, Address: n1.ExternalIP(f).String()})
	}
	n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: testnet.Node1Name})
	return n
}

// Addresses of a service in the case's family.

func (e *env) clusterIP(s *v1.Service, port uint16) netip.AddrPort {
	return e.famAddr(s.Spec.ClusterIPs, port)
}

func (e *env) externalIP(s *v1.Service, port uint16) netip.AddrPort {
	return e.famAddr(s.Spec.ExternalIPs, port)
}

// lbIP returns the i-th ingress IP of the case's family.
func (e *env) lbIP(s *v1.Service, i int, port uint16) netip.AddrPort {
	var fam []netip.Addr
	for _, in := range s.Status.LoadBalancer.Ingress {
		if a := netip.MustParseAddr(in.IP); model.FamilyOf(a) == e.fam {
			fam = append(fam, a)
		}
	}
	if i >= len(fam) {
		e.t.Fatalf("proxiertest: service %s has no %s ingress IP #%d", s.Name, e.fam, i)
	}
	return netip.AddrPortFrom(fam[i], port)
}

func (e *env) famAddr(ips []string, port uint16) netip.AddrPort {
	for _, ip := range ips {
		a := netip.MustParseAddr(ip)
		if model.FamilyOf(a) == e.fam {
			return netip.AddrPortFrom(a, port)
		}
	}
	e.t.Fatalf("proxiertest: no %s address in %v", e.fam, ips)
	return netip.AddrPort{}
}
