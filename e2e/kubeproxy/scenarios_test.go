package kubeproxy_test

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

// objNamespace is the namespace of every object of the test.
const objNamespace = "kpdiff"

// Endpoint sets of a scenario. The local endpoint is node1-pod1, the
// remote one node2-pod1; node1-pod2 is never an endpoint (the "pod"
// client).
const (
	epLocalRemote     = "local+remote"
	epRemote          = "remote"
	epLocal           = "local"
	epNone            = "none"
	epTermLocalRemote = "termlocal+remote" // local terminating but serving, remote ready
	epAllTerm         = "allterm"          // both terminating but serving
	epRemoteTerm      = "remoteterm"       // remote terminating but serving (phase 2 only)
)

var endpointSets = []string{epLocalRemote, epRemote, epLocal, epNone, epTermLocalRemote, epAllTerm}

// Source ranges of a LoadBalancer scenario.
const (
	rangesNone     = "none"
	rangesClient   = "client" // the outside client's address
	rangesElsewhen = "other"  // a range that holds none of the topology's hosts
)

// Phase-2 changes; the generator picks one per scenario.
const (
	chToggleLocal = "toggle-local-endpoint" // remove the local endpoint, or add it
	chFlipETP     = "flip-eTP"              // flip externalTrafficPolicy (iTP for ClusterIP)
	chFlipITP     = "flip-iTP"              // flip internalTrafficPolicy
	chEndpoints   = "endpoints-none-or-all" // endpoints to none, or from none to local+remote
)

var changes = []string{chToggleLocal, chFlipETP, chFlipITP, chEndpoints}

// state is what a scenario's Service and EndpointSlice look like in one
// phase.
type state struct {
	typ       v1.ServiceType
	etpLocal  bool
	itpLocal  bool
	affinity  bool
	ranges    string
	endpoints string
}

func (s state) String() string {
	etp, itp := "Cluster", "Cluster"
	if s.etpLocal {
		etp = "Local"
	}
	if s.itpLocal {
		itp = "Local"
	}
	aff := "None"
	if s.affinity {
		aff = "ClientIP"
	}
	return fmt.Sprintf("%s eTP=%s iTP=%s affinity=%s ranges=%s endpoints=%s", s.typ, etp, itp, aff, s.ranges, s.endpoints)
}

// scenario is one Service, single-stack of one family, in two phases.
type scenario struct {
	idx    int
	name   string
	fam    model.IPFamily
	phases [2]state
	change string
	// defaults marks the scenarios of the group where neither side is
	// given nodePortAddresses (each uses its own default).
	defaults bool
}

func (sc *scenario) String() string {
	return fmt.Sprintf("%s %s [%s] then %s [%s]", sc.name, sc.fam, sc.phases[0], sc.change, sc.phases[1])
}

// generate returns the scenario matrix: every meaningful combination of
// type × (eTP, iTP) × affinity × source ranges × endpoints × family,
// thinned by fixed rules (not by hand):
//   - eTP exists only for NodePort and LoadBalancer, source ranges only
//     for LoadBalancer;
//   - ClientIP affinity only with source ranges none and the endpoint
//     sets with two serving endpoints (local+remote, allterm), where
//     stickiness is observable;
//   - source ranges other than none only with affinity None.
//
// Each scenario's phase 2 applies changes[idx % len(changes)].
func generate() []*scenario {
	var out []*scenario
	add := func(fam model.IPFamily, st state) {
		sc := &scenario{idx: len(out), fam: fam}
		sc.name = fmt.Sprintf("s%03d", sc.idx)
		sc.phases[0] = st
		sc.change = changes[sc.idx%len(changes)]
		sc.phases[1] = applyChange(st, sc.change)
		out = append(out, sc)
	}
	for _, fam := range []model.IPFamily{model.IPv4, model.IPv6} {
		for _, typ := range []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer} {
			etps := []bool{false, true}
			if typ == v1.ServiceTypeClusterIP {
				etps = []bool{false}
			}
			ranges := []string{rangesNone}
			if typ == v1.ServiceTypeLoadBalancer {
				ranges = []string{rangesNone, rangesClient, rangesElsewhen}
			}
			for _, etp := range etps {
				for _, itp := range []bool{false, true} {
					for _, aff := range []bool{false, true} {
						for _, rg := range ranges {
							if aff && rg != rangesNone {
								continue
							}
							for _, eps := range endpointSets {
								if aff && eps != epLocalRemote && eps != epAllTerm {
									continue
								}
								add(fam, state{typ: typ, etpLocal: etp, itpLocal: itp, affinity: aff, ranges: rg, endpoints: eps})
							}
						}
					}
				}
			}
		}
	}
	return out
}

// generateDefaults returns the small group run with each side's default
// nodePortAddresses: NodePort and LoadBalancer, policies Cluster,
// endpoints local+remote, both families.
func generateDefaults(first int) []*scenario {
	var out []*scenario
	for _, fam := range []model.IPFamily{model.IPv4, model.IPv6} {
		for _, typ := range []v1.ServiceType{v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer} {
			sc := &scenario{idx: first + len(out), fam: fam, defaults: true}
			sc.name = fmt.Sprintf("s%03d", sc.idx)
			sc.phases[0] = state{typ: typ, ranges: rangesNone, endpoints: epLocalRemote}
			sc.change = chToggleLocal
			sc.phases[1] = applyChange(sc.phases[0], sc.change)
			out = append(out, sc)
		}
	}
	return out
}

func applyChange(st state, ch string) state {
	switch ch {
	case chToggleLocal:
		st.endpoints = map[string]string{
			epLocalRemote:     epRemote,
			epRemote:          epLocalRemote,
			epLocal:           epNone,
			epNone:            epLocal,
			epTermLocalRemote: epRemote,
			epAllTerm:         epRemoteTerm,
		}[st.endpoints]
	case chFlipETP:
		if st.typ == v1.ServiceTypeClusterIP {
			st.itpLocal = !st.itpLocal
		} else {
			st.etpLocal = !st.etpLocal
		}
	case chFlipITP:
		st.itpLocal = !st.itpLocal
	case chEndpoints:
		if st.endpoints == epNone {
			st.endpoints = epLocalRemote
		} else {
			st.endpoints = epNone
		}
	}
	return st
}

// Address plan. Scenario i gets cluster IP, external IP and load-balancer
// IP number i of these ranges (all routed by node1 via its uplink), node
// port 30000+i (TCP port 80 "http"), 32000+i (UDP port 53 "dns") and
// health check node port 31000+i.
func clusterIP(fam model.IPFamily, i int) netip.Addr {
	if fam == model.IPv6 {
		return nthV6("fd00:10:96::", i+2)
	}
	return netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 2)})
}

func externalIP(fam model.IPFamily, i int) netip.Addr {
	if fam == model.IPv6 {
		return nthV6("2001:db8:e::", i+2)
	}
	return netip.AddrFrom4([4]byte{198, 18, byte(i / 250), byte(i%250 + 2)})
}

func lbIP(fam model.IPFamily, i int) netip.Addr {
	if fam == model.IPv6 {
		return nthV6("2001:db8:1b::", i+2)
	}
	return netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 2)})
}

func nthV6(base string, n int) netip.Addr {
	b := netip.MustParseAddr(base).As16()
	b[14], b[15] = byte(n>>8), byte(n)
	return netip.AddrFrom16(b)
}

func nodePort(i int) int32            { return int32(30000 + i) }
func udpNodePort(i int) int32         { return int32(32000 + i) }
func healthCheckNodePort(i int) int32 { return int32(31000 + i) }

// sourceRange returns the loadBalancerSourceRanges entry of a scenario.
func sourceRange(fam model.IPFamily, ranges string, tn *testnet.Topology) string {
	switch ranges {
	case rangesClient:
		return netip.PrefixFrom(tn.Client.IP(fam), tn.Client.IP(fam).BitLen()).String()
	case rangesElsewhen:
		if fam == model.IPv6 {
			return "2001:db8:99::/64"
		}
		return "203.0.113.0/24"
	}
	return ""
}

func k8sFamily(f model.IPFamily) v1.IPFamily {
	if f == model.IPv6 {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// objects returns the scenario's Service and EndpointSlice in phase ph, as
// the API server would store them. tn supplies the pods' addresses (every
// topology has the same).
func (sc *scenario) objects(ph int, tn *testnet.Topology) (*v1.Service, *discoveryv1.EndpointSlice) {
	st := sc.phases[ph]
	fam := sc.fam
	policy := v1.IPFamilyPolicySingleStack
	cip := clusterIP(fam, sc.idx).String()
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: objNamespace, Name: sc.name, UID: types.UID("uid-" + sc.name)},
		Spec: v1.ServiceSpec{
			Type:           st.typ,
			ClusterIP:      cip,
			ClusterIPs:     []string{cip},
			IPFamilies:     []v1.IPFamily{k8sFamily(fam)},
			IPFamilyPolicy: &policy,
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8081)},
			},
			SessionAffinity: v1.ServiceAffinityNone,
		},
	}
	itp := v1.ServiceInternalTrafficPolicyCluster
	if st.itpLocal {
		itp = v1.ServiceInternalTrafficPolicyLocal
	}
	svc.Spec.InternalTrafficPolicy = &itp
	if st.affinity {
		timeout := int32(10800)
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
	if st.typ != v1.ServiceTypeClusterIP {
		svc.Spec.Ports[0].NodePort = nodePort(sc.idx)
		svc.Spec.Ports[1].NodePort = udpNodePort(sc.idx)
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		if st.etpLocal {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
	}
	if st.typ == v1.ServiceTypeLoadBalancer {
		alloc := true
		svc.Spec.AllocateLoadBalancerNodePorts = &alloc
		svc.Spec.ExternalIPs = []string{externalIP(fam, sc.idx).String()}
		if st.etpLocal {
			svc.Spec.HealthCheckNodePort = healthCheckNodePort(sc.idx)
		}
		if r := sourceRange(fam, st.ranges, tn); r != "" {
			svc.Spec.LoadBalancerSourceRanges = []string{r}
		}
		mode := v1.LoadBalancerIPModeVIP
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP(fam, sc.idx).String(), IPMode: &mode}}
	}

	name, proto, port := "http", v1.ProtocolTCP, int32(8080)
	uname, uproto, uport := "dns", v1.ProtocolUDP, int32(8081)
	sl := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: objNamespace,
			Name:      sc.name + "-" + strings.ToLower(fam.String()),
			UID:       types.UID("uid-slice-" + sc.name),
			Labels: map[string]string{
				discoveryv1.LabelServiceName: sc.name,
				discoveryv1.LabelManagedBy:   "kpdiff",
			},
		},
		AddressType: discoveryv1.AddressType(k8sFamily(fam)),
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}, {Name: &uname, Protocol: &uproto, Port: &uport}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	local, remote := tn.Node1.Pods[0], tn.Node2.Pods[0]
	add := func(p *testnet.Pod, rdy, srv, term bool) {
		node := p.Node.Name
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP(fam).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &rdy, Serving: &srv, Terminating: &term},
			NodeName:   &node,
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: objNamespace, Name: p.Name},
		})
	}
	switch st.endpoints {
	case epLocalRemote:
		add(local, true, true, false)
		add(remote, true, true, false)
	case epRemote:
		add(remote, true, true, false)
	case epLocal:
		add(local, true, true, false)
	case epNone:
	case epTermLocalRemote:
		add(local, false, true, true)
		add(remote, true, true, false)
	case epAllTerm:
		add(local, false, true, true)
		add(remote, false, true, true)
	case epRemoteTerm:
		add(remote, false, true, true)
	default:
		panic("unknown endpoint set " + st.endpoints)
	}
	return svc, sl
}
