package scale

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names and ports every generated service shares.
const (
	Namespace  = "bench"
	PortName   = "http"
	Port       = 80
	TargetPort = 8080
	// TargetName is the name of the measured service.
	TargetName = "target"
	// NodeName is the node the endpoints of the generated services are
	// on (not the proxier's node: no endpoint of theirs is local).
	NodeName = "node2"
)

// TargetIP is the cluster IP of the measured service.
var TargetIP = netip.MustParseAddr("10.100.0.10")

// Service is one service with one TCP port.
type Service struct {
	// Name is the service's name in [Namespace].
	Name string
	// ClusterIP is the service's cluster IP; it listens on [Port].
	ClusterIP netip.Addr
	// NodePort is the service's node port, or zero.
	NodePort uint16
	// Endpoints are the endpoint addresses, all serving [TargetPort].
	Endpoints []netip.Addr
	// EndpointNode is the node of the endpoints.
	EndpointNode string
}

func addr4(base [4]byte, off int) netip.Addr {
	v := binary.BigEndian.Uint32(base[:]) + uint32(off)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// MaxNodePorts is how many generated services get a node port: every
// tenth of the first 27,680 (the node port range 30000-32767 holds 2,768).
const MaxNodePorts = 2768

// The largest generated sizes the address ranges hold (see the package
// comment): cluster IPs in 10.96.0.0/14, endpoints in 10.64.0.0/12.
const (
	MaxServices  = 250_000
	MaxEndpoints = 1<<20 - 1 // in all, over every service
)

// Services returns n services with eps endpoints each. Service i has the
// cluster IP 10.96.0.10+i, its endpoints are 10.64.0.1+(i*eps+j); every
// tenth service has a node port, as long as the node port range lasts.
// n must not exceed [MaxServices], nor n*eps [MaxEndpoints].
func Services(n, eps int) []Service {
	out := make([]Service, n)
	for i := range n {
		s := Service{
			Name:         fmt.Sprintf("svc-%05d", i),
			ClusterIP:    addr4([4]byte{10, 96, 0, 10}, i),
			Endpoints:    make([]netip.Addr, eps),
			EndpointNode: NodeName,
		}
		for j := range eps {
			s.Endpoints[j] = addr4([4]byte{10, 64, 0, 1}, i*eps+j)
		}
		if i%10 == 0 && i/10 < MaxNodePorts {
			s.NodePort = uint16(30000 + i/10)
		}
		out[i] = s
	}
	return out
}

// Target returns the measured service: cluster IP [TargetIP] with the
// given (real) endpoints on node.
func Target(node string, endpoints ...netip.Addr) Service {
	return Service{Name: TargetName, ClusterIP: TargetIP, Endpoints: endpoints, EndpointNode: node}
}

// ReplacementEndpoint returns the k-th address used to replace an
// endpoint in an endpoint change: 10.200.0.1+k.
func ReplacementEndpoint(k int) netip.Addr { return addr4([4]byte{10, 200, 0, 1}, k) }

// WithEndpoint returns s with its endpoint j replaced by a.
func (s Service) WithEndpoint(j int, a netip.Addr) Service {
	s.Endpoints = append([]netip.Addr(nil), s.Endpoints...)
	s.Endpoints[j] = a
	return s
}

// Object returns the v1.Service of s.
func (s Service) Object(uid int) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.Name, UID: types.UID("uid-" + strconv.Itoa(uid)), ResourceVersion: "1"},
		Spec: v1.ServiceSpec{
			Type:            v1.ServiceTypeClusterIP,
			ClusterIP:       s.ClusterIP.String(),
			ClusterIPs:      []string{s.ClusterIP.String()},
			IPFamilies:      []v1.IPFamily{v1.IPv4Protocol},
			Ports:           []v1.ServicePort{{Name: PortName, Protocol: v1.ProtocolTCP, Port: Port, TargetPort: intstr.FromInt32(TargetPort)}},
			SessionAffinity: v1.ServiceAffinityNone,
		},
	}
	if s.NodePort != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = int32(s.NodePort)
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
	return svc
}

// MaxSliceEndpoints is how many endpoints one EndpointSlice holds at
// most: the EndpointSlice controller's default
// (--max-endpoints-per-slice). A service with more has several.
const MaxSliceEndpoints = 100

// NumSlices returns how many EndpointSlices s has: one per
// [MaxSliceEndpoints] endpoints, at least one.
func (s Service) NumSlices() int {
	return max(1, (len(s.Endpoints)+MaxSliceEndpoints-1)/MaxSliceEndpoints)
}

// Slice returns the first EndpointSlice of s, the one holding its
// endpoints 0 to [MaxSliceEndpoints]-1: with no more endpoints than
// that, all of them (see [Service.Slices]). gen is its resource version.
func (s Service) Slice(gen int) *discoveryv1.EndpointSlice { return s.slice(0, gen) }

// Slices returns the EndpointSlices of s as the EndpointSlice controller
// fills them: its endpoints in order, [MaxSliceEndpoints] to a slice. The
// first is [Service.Slice]; the k-th after it is named like it with
// "-k" added. gen is their resource version.
func (s Service) Slices(gen int) []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, s.NumSlices())
	for k := range out {
		out[k] = s.slice(k, gen)
	}
	return out
}

// slice returns the k-th EndpointSlice of s.
func (s Service) slice(k, gen int) *discoveryv1.EndpointSlice {
	port := int32(TargetPort)
	name := PortName
	proto := v1.ProtocolTCP
	ready := true
	node := s.EndpointNode
	sliceName := s.Name + "-bench"
	if k > 0 {
		sliceName += "-" + strconv.Itoa(k)
	}
	eps := s.Endpoints[min(len(s.Endpoints), k*MaxSliceEndpoints):min(len(s.Endpoints), (k+1)*MaxSliceEndpoints)]
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: Namespace, Name: sliceName, ResourceVersion: strconv.Itoa(gen + 1),
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		Endpoints:   make([]discoveryv1.Endpoint, len(eps)),
	}
	for j, a := range eps {
		sl.Endpoints[j] = discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		}
	}
	return sl
}

// Objects returns the Services of svcs and their EndpointSlices
// ([Service.Slices]), in the order of svcs: with at most
// [MaxSliceEndpoints] endpoints per service, slices[i] is svcs[i]'s only
// one.
func Objects(svcs []Service) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	objs := make([]*v1.Service, len(svcs))
	n := 0
	for _, s := range svcs {
		n += s.NumSlices()
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, n)
	for i, s := range svcs {
		objs[i] = s.Object(i)
		slices = append(slices, s.Slices(0)...)
	}
	return objs, slices
}

// Change is the k-th endpoint change of a benchmark over svcs (the
// target excluded): which service, and the service after the change (its
// first endpoint replaced). Changes walk through the services with a
// large stride, so that consecutive changes touch different services.
func Change(svcs []Service, k int) (idx int, changed Service) {
	n := len(svcs)
	idx = (k*7919 + n/2) % n
	if len(svcs[idx].Endpoints) == 0 {
		return idx, svcs[idx]
	}
	return idx, svcs[idx].WithEndpoint(0, ReplacementEndpoint(k))
}
