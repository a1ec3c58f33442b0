package backendtest

import (
	"net/netip"
	"testing"

	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
)

func TestRequest(t *testing.T) {
	a := ClusterSvc("a", model.TCP, "10.96.0.1", 80, "10.0.1.2:8080", "10.0.2.2:8080")
	b := ClusterSvc("b", model.UDP, "10.96.0.2", 53)
	c := a.With(func(sp *model.ServicePort) { sp.Name = PortName("c", "dns", model.UDP) }).
		WithTargets(Endpoints("10.0.1.2:8080"), Endpoints("10.0.3.2:8080"), true)

	full := Request(model.IPv4, []Svc{a, b, c}, nil)
	if !full.Full || len(full.Changed) != 3 || full.State.Family != model.IPv4 || len(full.State.Services) != 3 {
		t.Fatalf("full request: %+v", full)
	}
	if eps := full.State.Endpoints[a.Port.Name]; len(eps) != 2 {
		t.Errorf("endpoints of a (the same internal and external targets): %v", eps)
	}
	if eps := full.State.Endpoints[c.Port.Name]; len(eps) != 2 || eps[1].Addr.String() != "10.0.3.2:8080" {
		t.Errorf("endpoints of c: %v", eps)
	}
	if full.Targets[b.Port.Name].HasEndpoints || full.State.Services[b.Port.Name] != b.Port {
		t.Errorf("b: %+v", full.Targets[b.Port.Name])
	}
	if a.Port.Name == c.Port.Name || a.Port.Name.Namespace != Namespace {
		t.Errorf("With changed the original: %v", a.Port.Name)
	}

	gone := PortName("gone", "", model.TCP)
	inc := Request(model.IPv4, []Svc{a}, append(Names(a), gone))
	if inc.Full || len(inc.Changed) != 2 {
		t.Errorf("incremental request: %+v", inc)
	}
	if none := Request(model.IPv4, []Svc{a}, []model.ServicePortName{}); none.Full || len(none.Changed) != 0 {
		t.Errorf("request with nothing changed: %+v", none)
	}

	grown := a.WithAdded(Endpoint("10.200.0.1:8080"))
	if len(grown.Targets.Internal) != 3 || len(grown.Targets.External) != 3 || len(a.Targets.Internal) != 2 || grown.Port != a.Port {
		t.Errorf("WithAdded: %v from %v", grown.Targets, a.Targets)
	}
}

func TestScaleServices(t *testing.T) {
	svcs := ScaleServices(30, 3)
	want := scale.Services(30, 3)
	if len(svcs) != len(want) {
		t.Fatalf("%d services", len(svcs))
	}
	for i, s := range svcs {
		w := want[i]
		if s.Port.Name.Name != w.Name || s.Port.Name.Namespace != scale.Namespace || s.Port.ClusterIP != w.ClusterIP ||
			s.Port.NodePort != w.NodePort || s.Port.Port != scale.Port || s.Port.Protocol != model.TCP {
			t.Fatalf("service %d: %+v, want %+v", i, s.Port, w)
		}
		if len(s.Targets.Internal) != 3 || !s.Targets.HasEndpoints {
			t.Fatalf("service %d: targets %+v", i, s.Targets)
		}
		for j, e := range s.Targets.Internal {
			if e.Addr != netip.AddrPortFrom(w.Endpoints[j], scale.TargetPort) || !e.Ready || !e.Serving {
				t.Fatalf("service %d endpoint %d: %+v", i, j, e)
			}
		}
	}
	if svcs[10].Port.NodePort == 0 || svcs[11].Port.NodePort != 0 {
		t.Errorf("node ports: %d, %d", svcs[10].Port.NodePort, svcs[11].Port.NodePort)
	}
}
