package informer

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/changetracker"
)

// This file strips, before the informers store them, the parts of the
// objects that no proxier reads, so that the caches of a node's proxier
// hold what it needs and no more (the largest savings: managed fields on
// every object, and the image list of the Node). Each function keeps
// every field the change tracker, the engine and examples/proxy read; a
// test checks that a stripped object gives the same state.

// keptServiceAnnotations are the Service annotations proxiers read.
var keptServiceAnnotations = []string{
	changetracker.AnnotationScheduler,
	v1.AnnotationLoadBalancerSourceRangesKey,
}

// leanMeta drops the metadata no proxier reads: managed fields, owner
// references, finalizers, and the annotations not named in keep.
func leanMeta(m *metav1.ObjectMeta, keep ...string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	if len(m.Annotations) == 0 {
		return
	}
	var kept map[string]string
	for _, k := range keep {
		if v, ok := m.Annotations[k]; ok {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	m.Annotations = kept
}

// leanService strips a Service to what proxiers read: the spec, labels,
// the annotations above and the load-balancer ingress of the status.
func leanService(o any) (any, error) {
	s, ok := o.(*v1.Service)
	if !ok {
		return o, nil
	}
	leanMeta(&s.ObjectMeta, keptServiceAnnotations...)
	s.Status.Conditions = nil
	for i := range s.Status.LoadBalancer.Ingress {
		s.Status.LoadBalancer.Ingress[i].Ports = nil
	}
	return s, nil
}

// leanSlice strips an EndpointSlice to what proxiers read: labels, the
// trigger-time annotation, address type, ports, and each endpoint's
// addresses, conditions, node, zone and hints.
func leanSlice(o any) (any, error) {
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return o, nil
	}
	leanMeta(&s.ObjectMeta, v1.EndpointsLastChangeTriggerTime)
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		ep.TargetRef = nil
		ep.Hostname = nil
		ep.DeprecatedTopology = nil
	}
	return s, nil
}

// leanNode strips the node's Node object to what proxiers read: labels,
// deletion timestamp, pod CIDRs, taints and addresses.
func leanNode(o any) (any, error) {
	n, ok := o.(*v1.Node)
	if !ok {
		return o, nil
	}
	leanMeta(&n.ObjectMeta)
	n.Status = v1.NodeStatus{Addresses: n.Status.Addresses}
	return n, nil
}
