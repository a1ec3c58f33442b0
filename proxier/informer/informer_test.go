package informer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

func svc(name string, labels map[string]string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Port: 80}}}}
}

func TestRunDeliversSelectedObjects(t *testing.T) {
	client := fake.NewClientset(
		svc("plain", nil),
		svc("other-proxy", map[string]string{LabelServiceProxyName: "someone-else"}),
		svc("headless", map[string]string{v1.IsHeadlessService: ""}),
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "plain"}}, AddressType: discoveryv1.AddressTypeIPv4},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{"topology.kubernetes.io/zone": "a"}}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node2"}},
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:10:96::/108"}}},
	)
	ev := &fakeproxier.Events{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, ev, Config{NodeName: "node1"}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, ev, "svc synced", "eps synced", "node synced", "svc+ plain", "eps+ plain-1", "node+ node1",
		"cidrs [10.96.0.0/16 fd00:10:96::/108]")

	// Live events flow too.
	if _, err := client.CoreV1().Services("ns").Create(ctx, svc("late", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "plain-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "more"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev, "svc+ late", "eps- plain-1", "cidrs [10.96.0.0/16 10.97.0.0/16 fd00:10:96::/108]")

	for _, unwanted := range []string{"svc+ other-proxy", "svc+ headless", "node+ node2"} {
		if ev.Has(unwanted) {
			t.Errorf("got %q; the selectors must filter it", unwanted)
		}
	}
}

func TestSelector(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"", "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"},
		{"mine", "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=mine"},
	} {
		sel, err := Selector(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if sel.String() != tc.want {
			t.Errorf("Selector(%q) = %q, want %q", tc.name, sel.String(), tc.want)
		}
	}
}

func waitFor(t *testing.T, ev *fakeproxier.Events, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range want {
		for !ev.Has(w) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q event; got %v", w, ev.Lines())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// gatedAdds holds every Service add until gate closes and records how
// many adds it had delivered when OnServiceSynced came.
type gatedAdds struct {
	*fakeproxier.Events
	gate         chan struct{}
	adds         atomic.Int32
	addsAtSynced atomic.Int32
}

func (g *gatedAdds) OnServiceAdd(s *v1.Service) {
	<-g.gate
	g.adds.Add(1)
	g.Events.OnServiceAdd(s)
}

func (g *gatedAdds) OnServiceSynced() {
	g.addsAtSynced.Store(g.adds.Load())
	g.Events.OnServiceSynced()
}

// TestRunSyncedAfterHandlersHaveTheInitialList: the Synced handlers come
// only after the handlers received every object of the initial lists,
// not as soon as the informers' stores hold them (a proxier's first
// sync on part of the cluster would remove the rest's rules).
func TestRunSyncedAfterHandlersHaveTheInitialList(t *testing.T) {
	const n = 50
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, svc(fmt.Sprintf("s%d", i), nil))
	}
	client := fake.NewClientset(objs...)
	g := &gatedAdds{Events: &fakeproxier.Events{}, gate: make(chan struct{})}
	g.addsAtSynced.Store(-1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, g, Config{NoServiceCIDRs: true}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The store fills while the handler is held; give Run the time to
	// (wrongly) call the Synced handlers.
	time.Sleep(300 * time.Millisecond)
	if g.Has("svc synced") {
		t.Errorf("OnServiceSynced came after %d of %d adds", g.addsAtSynced.Load(), n)
	}
	close(g.gate)
	waitFor(t, g.Events, "svc synced", "eps synced")
	if got := g.addsAtSynced.Load(); got != n {
		t.Errorf("OnServiceSynced came after %d of %d adds", got, n)
	}
}
