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
// every object, the labels of Services and EndpointSlices (a Helm chart's
// half dozen, which the EndpointSlice controller copies to each slice),
// and the image list of the Node). Each function keeps every field the
// change tracker, the engine and examples/proxy read; a test checks that a
// stripped object gives the same state.

// keptServiceAnnotations are the Service annotations proxiers read.
var keptServiceAnnotations = []string{
	changetracker.AnnotationScheduler,
	changetracker.AnnotationForwardingMode,
	v1.AnnotationLoadBalancerSourceRangesKey,
}

// keptServiceLabels are the Service labels proxiers read (the informers'
// selector asks the API server for them too).
var keptServiceLabels = []string{
	v1.IsHeadlessService,
	changetracker.LabelServiceProxyName,
}

// keptSliceLabels are the EndpointSlice labels proxiers read: the
// Service's name, and those of the informers' selector.
var keptSliceLabels = []string{
	discoveryv1.LabelServiceName,
	v1.IsHeadlessService,
	changetracker.LabelServiceProxyName,
}

// leanMeta drops the metadata no proxier reads: managed fields, owner
// references, finalizers, and the annotations not named in keep.
func leanMeta(m *metav1.ObjectMeta, keep ...string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	m.Annotations = only(m.Annotations, keep)
}

// only returns the entries of m under keys, nil if none; m itself when it
// holds nothing else.
func only(m map[string]string, keys []string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	var kept map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	if len(kept) == len(m) {
		return m
	}
	return kept
}

// leanService strips a Service to what proxiers read: the spec but the
// selector (endpoints come from EndpointSlices), the labels and
// annotations above and the load-balancer ingress of the status.
func leanService(o any) (any, error) {
	s, ok := o.(*v1.Service)
	if !ok {
		return o, nil
	}
	leanMeta(&s.ObjectMeta, keptServiceAnnotations...)
	s.Labels = only(s.Labels, keptServiceLabels)
	s.Spec.Selector = nil
	s.Status.Conditions = nil
	for i := range s.Status.LoadBalancer.Ingress {
		s.Status.LoadBalancer.Ingress[i].Ports = nil
	}
	return s, nil
}

// leanSlice strips an EndpointSlice to what proxiers read: the labels
// above, the trigger-time annotation, address type, ports, and each
// endpoint's addresses, conditions, node, zone and hints.
func leanSlice(o any) (any, error) {
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return o, nil
	}
	leanMeta(&s.ObjectMeta, v1.EndpointsLastChangeTriggerTime)
	s.Labels = only(s.Labels, keptSliceLabels)
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
