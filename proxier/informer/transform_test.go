package informer

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

// richMeta is metadata with everything a cluster puts there.
func richMeta(name string, annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: "ns", Name: name, ResourceVersion: "7",
		Labels:          map[string]string{discoveryv1.LabelServiceName: "web", "app": "web"},
		Annotations:     annotations,
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 4096)}}},
		OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web", UID: "u-web"}},
		Finalizers:      []string{"service.kubernetes.io/load-balancer-cleanup"},
	}
}

// TestLeanObjectsGiveTheSameState checks that the stripped Service and
// EndpointSlice give a change tracker the same state as the full ones,
// and that what was stripped is gone.
func TestLeanObjectsGiveTheSameState(t *testing.T) {
	svc := &v1.Service{
		ObjectMeta: richMeta("web", map[string]string{
			changetracker.AnnotationScheduler:           "mh",
			changetracker.AnnotationForwardingMode:      "dsr",
			v1.AnnotationLoadBalancerSourceRangesKey:    "198.51.100.0/24",
			"kubectl.kubernetes.io/last-applied-config": string(make([]byte, 2048)),
		}),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports:                 []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 32000,
			SessionAffinity: v1.ServiceAffinityClientIP, ExternalIPs: []string{"203.0.113.5"},
			Selector: map[string]string{"app": "web", "tier": "front"},
		},
		Status: v1.ServiceStatus{
			LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "203.0.113.7", IPMode: ptr.To(v1.LoadBalancerIPModeVIP), Ports: []v1.PortStatus{{Port: 80}}}}},
			Conditions:   []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(time.Unix(1, 0))}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: richMeta("web-1", map[string]string{
			v1.EndpointsLastChangeTriggerTime: "2026-11-26T01:00:00Z",
			"endpointslice.kubernetes.io/x":   "y",
		}),
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.244.1.2"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			Hostname:   ptr.To("web-0"), NodeName: ptr.To("node1"), Zone: ptr.To("zone-a"),
			Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}},
			TargetRef:          &v1.ObjectReference{Kind: "Pod", Name: "web-0"},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node1"},
		}},
	}
	state := func(svc *v1.Service, slice *discoveryv1.EndpointSlice) *model.State {
		tr := changetracker.New(changetracker.Config{Family: model.IPv4, NodeName: "node1"})
		tr.OnService(nil, svc)
		tr.OnEndpointSlice(slice, false)
		tr.Apply()
		return tr.State()
	}
	want := state(svc, slice)
	ls, _ := leanService(svc.DeepCopy())
	lsl, _ := leanSlice(slice.DeepCopy())
	lean, leanS := ls.(*v1.Service), lsl.(*discoveryv1.EndpointSlice)
	if got := state(lean, leanS); !reflect.DeepEqual(got, want) {
		t.Errorf("state from the lean objects:\n%+v\nwant\n%+v", got, want)
	}
	if len(want.Services) != 1 || len(want.Endpoints) != 1 {
		t.Fatalf("the sample gives no state: %+v", want)
	}
	if lean.ManagedFields != nil || lean.OwnerReferences != nil || lean.Finalizers != nil || len(lean.Annotations) != 3 || lean.Status.Conditions != nil ||
		lean.Labels != nil || lean.Spec.Selector != nil {
		t.Errorf("Service not stripped: %+v %+v", lean.ObjectMeta, lean.Spec)
	}
	if ep := leanS.Endpoints[0]; ep.TargetRef != nil || ep.Hostname != nil || ep.DeprecatedTopology != nil || len(leanS.Annotations) != 1 ||
		!reflect.DeepEqual(leanS.Labels, map[string]string{discoveryv1.LabelServiceName: "web"}) {
		t.Errorf("EndpointSlice not stripped: %+v %+v", leanS.ObjectMeta, ep)
	}
}

// TestLeanObjectsKeepSelectionLabels checks that the labels that select a
// Service for a proxier (its service-proxy-name, headless) are kept on
// Services and EndpointSlices, and give the same state with and without
// the other labels: selected or not, as the whole object.
func TestLeanObjectsKeepSelectionLabels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		labels    map[string]string
		proxyName string
		tracked   bool
	}{
		{"plain", map[string]string{"app": "web"}, "", true},
		{"other proxy", map[string]string{"app": "web", changetracker.LabelServiceProxyName: "other"}, "", false},
		{"this proxy", map[string]string{"app": "web", changetracker.LabelServiceProxyName: "mine"}, "mine", true},
		{"this proxy, unlabelled", map[string]string{"app": "web"}, "mine", false},
		{"headless", map[string]string{"app": "web", v1.IsHeadlessService: ""}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Labels: tc.labels},
				Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
					Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
			}
			sliceLabels := map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
			for k, v := range tc.labels {
				sliceLabels[k] = v
			}
			slice := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: sliceLabels},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			}
			state := func(svc *v1.Service, slice *discoveryv1.EndpointSlice) *model.State {
				tr := changetracker.New(changetracker.Config{Family: model.IPv4, NodeName: "node1", ServiceProxyName: tc.proxyName})
				tr.OnService(nil, svc)
				tr.OnEndpointSlice(slice, false)
				tr.Apply()
				return tr.State()
			}
			want := state(svc, slice)
			if got := len(want.Services) == 1; got != tc.tracked {
				t.Fatalf("the whole Service tracked: %v, want %v: %+v", got, tc.tracked, want)
			}
			ls, _ := leanService(svc.DeepCopy())
			lsl, _ := leanSlice(slice.DeepCopy())
			lean, leanS := ls.(*v1.Service), lsl.(*discoveryv1.EndpointSlice)
			if got := state(lean, leanS); !reflect.DeepEqual(got, want) {
				t.Errorf("state from the lean objects:\n%+v\nwant\n%+v", got, want)
			}
			wantLabels := map[string]string{}
			for _, k := range []string{changetracker.LabelServiceProxyName, v1.IsHeadlessService} {
				if v, ok := tc.labels[k]; ok {
					wantLabels[k] = v
				}
			}
			if len(lean.Labels) != len(wantLabels) || (len(wantLabels) > 0 && !reflect.DeepEqual(lean.Labels, wantLabels)) {
				t.Errorf("lean Service labels %v, want %v", lean.Labels, wantLabels)
			}
			wantLabels[discoveryv1.LabelServiceName] = "web"
			if !reflect.DeepEqual(leanS.Labels, wantLabels) {
				t.Errorf("lean EndpointSlice labels %v, want %v", leanS.Labels, wantLabels)
			}
		})
	}
}

// TestOnly checks the map filter of the transforms.
func TestOnly(t *testing.T) {
	m := map[string]string{"a": "1", "b": "2"}
	if got := only(m, []string{"a", "b", "c"}); !reflect.DeepEqual(got, m) {
		t.Errorf("all kept: %v", got)
	}
	if got := only(m, []string{"b"}); !reflect.DeepEqual(got, map[string]string{"b": "2"}) || len(m) != 2 {
		t.Errorf("b kept: %v (input now %v)", got, m)
	}
	if got := only(m, []string{"c"}); got != nil {
		t.Errorf("none kept: %v, want nil", got)
	}
	if got := only(nil, []string{"a"}); got != nil {
		t.Errorf("from nil: %v", got)
	}
}

// TestLeanNode checks that the Node keeps what the engine and the daemon
// read (labels, pod CIDRs, taints, deletion, addresses) and loses its
// status otherwise.
func TestLeanNode(t *testing.T) {
	now := metav1.Now()
	n := &v1.Node{
		ObjectMeta: richMeta("node1", map[string]string{"node.alpha.kubernetes.io/ttl": "0"}),
		Spec:       v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, Taints: []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}},
		Status: v1.NodeStatus{
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
			Images:    []v1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
			NodeInfo:  v1.NodeSystemInfo{KernelVersion: "6.18"},
		},
	}
	n.Labels[v1.LabelTopologyZone] = "zone-a"
	n.DeletionTimestamp = &now
	o, _ := leanNode(n.DeepCopy())
	got := o.(*v1.Node)
	want := n.DeepCopy()
	want.ManagedFields, want.OwnerReferences, want.Finalizers, want.Annotations = nil, nil, nil, nil
	want.Status = v1.NodeStatus{Addresses: n.Status.Addresses}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("lean node:\n%+v\nwant\n%+v", got, want)
	}
}

// capture records the Services and Nodes it is delivered.
type capture struct {
	*fakeproxier.Events
	mu    sync.Mutex
	svcs  []*v1.Service
	nodes []*v1.Node
}

func (c *capture) OnServiceAdd(s *v1.Service) {
	c.mu.Lock()
	c.svcs = append(c.svcs, s)
	c.mu.Unlock()
	c.Events.OnServiceAdd(s)
}

func (c *capture) OnNodeAdd(n *v1.Node) {
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	c.Events.OnNodeAdd(n)
}

// TestRunDeliversLeanObjects checks that Run hands on, and caches, the
// stripped objects.
func TestRunDeliversLeanObjects(t *testing.T) {
	s := svc("plain", nil)
	s.ObjectMeta = richMeta("plain", map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"})
	s.Labels = nil
	n := &v1.Node{ObjectMeta: richMeta("node1", nil), Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"big"}}}}}
	n.Labels = nil
	client := fake.NewClientset(s, n)
	c := &capture{Events: &fakeproxier.Events{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, c, Config{NodeName: "node1", NoServiceCIDRs: true}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, c.Events, "svc+ plain", "node+ node1", "svc synced", "node synced")
	c.mu.Lock()
	defer c.mu.Unlock()
	if got := c.svcs[0]; got.ManagedFields != nil || got.Annotations != nil || got.OwnerReferences != nil {
		t.Errorf("the Service was delivered whole: %+v", got.ObjectMeta)
	}
	if got := c.nodes[0]; got.ManagedFields != nil || got.Status.Images != nil {
		t.Errorf("the Node was delivered whole: %+v", got)
	}
}
