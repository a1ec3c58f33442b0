package nftables_test

import (
	"context"
	"log"
	"log/slog"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// New programs a network namespace with nftables. Events come from any
// source (an informer, a file, the caller's own cache); here, one Service
// and its EndpointSlice, handed over directly. It needs CAP_NET_ADMIN in
// the namespace, so it has no checked output: see the conformance suite
// (proxier/proxiertest) for the same with real traffic.
func ExampleNew() {
	p, err := nftables.New(nftables.Config{Config: proxier.Config{
		NetNS:        "/var/run/netns/node1", // empty: the caller's own namespace
		NodeName:     "node1",
		Families:     []model.IPFamily{model.IPv4},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Logger:       slog.Default(),
	}})
	if err != nil {
		log.Fatal(err) // matches proxier.ErrNotSupported on a kernel without nf_tables
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)

	p.OnServiceAdd(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	})
	p.OnEndpointSliceAdd(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	})
	// The first sync waits for the initial lists.
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()

	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	if err := p.Flush(fctx); err != nil { // returns once the kernel holds the rules
		log.Fatal(err)
	}
	// 10.96.0.10:80 now reaches 10.244.1.2:8080: `nft list table ip proxykit`.
}
