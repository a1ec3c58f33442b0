package proxier

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestNodeSharedByTwoProxiers: two proxiers of one namespace, one per IP
// family, given one Node, serve a dual-stack Service's health check node
// port once, answering the larger count of local endpoints; when one
// goes, the other's count remains. Each opening its own servers, the
// second could not bind the port and its count was lost.
func TestNodeSharedByTwoProxiers(t *testing.T) {
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	node, err := NewNode(NodeConfig{NetNS: tp.Node1.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()

	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lb"},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeLoadBalancer,
			ClusterIP:             "10.96.0.5",
			ClusterIPs:            []string{"10.96.0.5", "fd00:96::5"},
			IPFamilies:            []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			Ports:                 []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30085}},
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:   32085,
		},
	}
	slice := func(at discoveryv1.AddressType, ips ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "lb-" + string(at), Labels: map[string]string{discoveryv1.LabelServiceName: "lb"}},
			AddressType: at,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for _, ip := range ips {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To("node-a"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return s
	}
	start := func(b Backend, s *discoveryv1.EndpointSlice) *Engine {
		e, err := New(Config{Node: node, NodeName: "node-a", MinSyncInterval: time.Millisecond}, b)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = e.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done; e.Close() })
		e.OnServiceAdd(svc)
		e.OnEndpointSliceAdd(s)
		e.OnServiceSynced()
		e.OnEndpointSlicesSynced()
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer fcancel()
		if err := e.Flush(fctx); err != nil {
			t.Fatal(err)
		}
		return e
	}
	local := func() (float64, error) {
		dst := netip.AddrPortFrom(tp.Node1.ExternalIP(model.IPv4), 32085)
		client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DialContext: func(context.Context, string, string) (net.Conn, error) {
				return tp.Client.DialTCP(dst, 2*time.Second)
			},
		}}
		resp, err := client.Get("http://" + dst.String() + "/")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var body struct {
			LocalEndpoints float64 `json:"localEndpoints"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		return body.LocalEndpoints, err
	}

	e4 := start(newRecorder(model.IPv4), slice(discoveryv1.AddressTypeIPv4, "10.244.1.2"))
	e6 := start(newRecorder(model.IPv6), slice(discoveryv1.AddressTypeIPv6, "fd00:10:244:1::2", "fd00:10:244:1::3"))
	if n, err := local(); err != nil || n != 2 {
		t.Fatalf("both proxiers: localEndpoints %v (%v), want 2, the larger count", n, err)
	}
	e6.Close()
	if n, err := local(); err != nil || n != 1 {
		t.Fatalf("after the IPv6 proxier closed: localEndpoints %v (%v), want the IPv4 proxier's 1", n, err)
	}
	e4.Close()
	if _, err := local(); err == nil {
		t.Fatal("the health check node port answers after both proxiers closed")
	}
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestServiceHealthErrorReported: a health check node port that cannot be
// opened (another program holds it) is reported to
// Config.ServiceHealthError with its Service and port, as kube-proxy
// records an event; once the port is free, the server opens.
func TestServiceHealthErrorReported(t *testing.T) {
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	var squatter net.Listener
	if err := tp.Node1.Do(func() error {
		var err error
		squatter, err = net.Listen("tcp", ":32087")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	type report struct {
		svc  model.ServiceName
		port uint16
	}
	reports := make(chan report, 100)
	e, err := New(Config{NetNS: tp.Node1.Path(), NodeName: "node-a", MinSyncInterval: time.Millisecond, NoConntrackCleanup: true,
		ServiceHealthError: func(svc model.ServiceName, port uint16, err error) {
			if err == nil {
				t.Error("a report without an error")
			}
			reports <- report{svc, port}
		}}, newRecorder(model.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; e.Close() })

	svc := testService("lb", "10.96.0.7", 80)
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30087
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 32087
	s := testSlice("lb", "lb-1", "10.244.1.2")
	s.Endpoints[0].NodeName = ptr.To("node-a")
	e.OnServiceAdd(svc)
	e.OnEndpointSliceAdd(s)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	select {
	case r := <-reports:
		if r.svc != (model.ServiceName{Namespace: "ns", Name: "lb"}) || r.port != 32087 {
			t.Fatalf("reported %+v, want ns/lb port 32087", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the taken health check port was not reported")
	}
	// Freed, the port opens at the next sync.
	squatter.Close()
	e.Sync()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := tp.Client.DialTCP(netip.AddrPortFrom(tp.Node1.ExternalIP(model.IPv4), 32087), time.Second)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the health check port did not open once free: %v", err)
		}
		e.Sync()
		time.Sleep(100 * time.Millisecond)
	}
}
