package informer_test

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
	"github.com/proxykit/proxykit/proxier/informer"
)

// Run watches Services, EndpointSlices, the node and the ServiceCIDRs
// with client-go informers and feeds a Proxier; here a fake clientset and
// the recording fake stand in for an API server and a real proxier.
func ExampleRun() {
	client := fake.NewClientset(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Port: 80}}},
	})
	p := &fakeproxier.Events{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- informer.Run(ctx, client, p, informer.Config{}) }()
	for !p.Has("eps synced") {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println(p.Has("svc+ web"), p.Has("svc synced"))
	// Output: true true
}
