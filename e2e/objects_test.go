package e2e

import (
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Every service has one TCP port, 80, targeting the pods' first server
// port.
var targetPort = int32(testnet.ServerPorts[0])

const servicePort = 80

// svcOpt changes a Service before it is created.
type svcOpt func(*v1.Service)

func nodePort(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }

func loadBalancer(s *v1.Service) { s.Spec.Type = v1.ServiceTypeLoadBalancer }

func externalLocal(s *v1.Service) {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
}

func clientIPAffinity(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }

func dualStack(s *v1.Service) { s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack) }

func labelled(k, v string) svcOpt {
	return func(s *v1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
}

// createService creates a selectorless Service (the test writes its
// EndpointSlices) and returns it as the API server completed it: cluster
// IPs, node ports, health check node port allocated.
func (e *env) createService(name string, opts ...svcOpt) *v1.Service {
	e.t.Helper()
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Port: servicePort, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort)}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	got, err := e.cs.CoreV1().Services(testNS).Create(e.ctx, s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create service %s: %v", name, err)
	}
	return got
}

// updateService applies f to the current Service and writes it back.
func (e *env) updateService(name string, f func(*v1.Service)) *v1.Service {
	e.t.Helper()
	s, err := e.cs.CoreV1().Services(testNS).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	f(s)
	if s, err = e.cs.CoreV1().Services(testNS).Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("update service %s: %v", name, err)
	}
	return s
}

// setLoadBalancerIngress patches the Service's status as a cloud
// controller would, and returns the ingress address.
func (e *env) setLoadBalancerIngress(name string, addr netip.Addr) {
	e.t.Helper()
	s, err := e.cs.CoreV1().Services(testNS).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: addr.String(), IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}}
	if _, err := e.cs.CoreV1().Services(testNS).UpdateStatus(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("load-balancer status of %s: %v", name, err)
	}
}

func (e *env) deleteService(name string) {
	e.t.Helper()
	if err := e.cs.CoreV1().Services(testNS).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete service %s: %v", name, err)
	}
}

// setEndpoints creates or replaces the EndpointSlice of family f of a
// service, with the pods as ready endpoints on their nodes.
func (e *env) setEndpoints(service string, f model.IPFamily, pods ...*testnet.Pod) {
	e.t.Helper()
	s := endpointSlice(service, f, pods...)
	c := e.cs.DiscoveryV1().EndpointSlices(testNS)
	cur, err := c.Get(e.ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(e.ctx, s, metav1.CreateOptions{})
	case err == nil:
		s.ResourceVersion = cur.ResourceVersion
		_, err = c.Update(e.ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		e.t.Fatalf("endpoints of %s: %v", service, err)
	}
}

func endpointSlice(service string, f model.IPFamily, pods ...*testnet.Pod) *discoveryv1.EndpointSlice {
	at, suffix := discoveryv1.AddressTypeIPv4, "-v4"
	if f == model.IPv6 {
		at, suffix = discoveryv1.AddressTypeIPv6, "-v6"
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: service + suffix, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   "e2e.proxykit.dev",
		}, Annotations: map[string]string{
			// What the EndpointSlice controller sets: the engine's
			// network programming latency metric starts here.
			v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano),
		}},
		AddressType: at,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(targetPort), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP(f).String()},
			NodeName:   ptr.To(p.Node.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	return s
}

// clusterIP returns the service's cluster IP of family f and port.
func clusterIP(t *testing.T, s *v1.Service, f model.IPFamily) netip.AddrPort {
	t.Helper()
	for _, a := range s.Spec.ClusterIPs {
		if ad := ip(a); ad.Is6() == (f == model.IPv6) {
			return netip.AddrPortFrom(ad, servicePort)
		}
	}
	t.Fatalf("service %s has no %v cluster IP: %v", s.Name, f, s.Spec.ClusterIPs)
	return netip.AddrPort{}
}

func names(pods ...*testnet.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}
