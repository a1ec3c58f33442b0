package changetracker_test

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/model"
)

func Example() {
	tr := changetracker.New(changetracker.Config{Family: model.IPv4, NodeName: "node-a"})

	dns := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dns"},
		Spec: v1.ServiceSpec{
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}},
		},
	}
	port := int32(5353)
	name := "dns"
	proto := v1.ProtocolUDP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: "dns-x1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "dns"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.7"}, NodeName: ptr("node-a")},
			{Addresses: []string{"10.244.2.9"}, NodeName: ptr("node-b")},
		},
	}

	tr.OnService(nil, dns)
	tr.OnEndpointSlice(slice, false)
	res := tr.Apply()
	fmt.Println(res)

	spn := model.ServicePortName{
		ServiceName: model.ServiceName{Namespace: "kube-system", Name: "dns"},
		Port:        "dns", Protocol: model.UDP,
	}
	sp := tr.State().Services[spn]
	fmt.Println(sp.ClusterIP, sp.Port)
	for _, ep := range tr.State().Endpoints[spn] {
		fmt.Println(ep, "local:", ep.Local)
	}

	// The slice goes away: its serving UDP endpoints are stale.
	tr.OnEndpointSlice(slice, true)
	fmt.Println(tr.Apply())

	// Output:
	// changed=[kube-system/dns:dns/UDP] staleEndpoints=[] staleServices=[kube-system/dns:dns/UDP]
	// 10.96.0.10 53
	// 10.244.1.7:5353 local: true
	// 10.244.2.9:5353 local: false
	// changed=[kube-system/dns:dns/UDP] staleEndpoints=[kube-system/dns:dns/UDP -> 10.244.1.7:5353 kube-system/dns:dns/UDP -> 10.244.2.9:5353] staleServices=[]
}

func ptr[T any](v T) *T { return &v }
