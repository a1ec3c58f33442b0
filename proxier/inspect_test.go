package proxier

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
)

// inspecting is a recorder that reads back the frontends it is told to.
type inspecting struct {
	*recorder
	mu  sync.Mutex
	got []Frontend
}

func (b *inspecting) Inspect(context.Context) ([]Frontend, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.got, nil
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func nodePortService(name, ip string, port, nodePort int32) *v1.Service {
	s := testService(name, ip, port)
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = nodePort
	return s
}

// TestInspectReportsDiffs checks that the report sets what the kernel
// holds beside what the state asks for: a frontend that agrees, one with
// an endpoint too many, one missing, a node port read per address, and a
// frontend nothing claims.
func TestInspectReportsDiffs(t *testing.T) {
	b := &inspecting{recorder: newRecorder(model.IPv4)}
	e, _ := newTestEngine(t, Config{MinSyncInterval: 10 * time.Millisecond}, b)
	e.OnServiceAdd(testService("a", "10.96.0.1", 80))
	e.OnServiceAdd(testService("b", "10.96.0.2", 80))
	e.OnServiceAdd(nodePortService("c", "10.96.0.3", 80, 30080))
	e.OnServiceAdd(testService("d", "10.96.0.4", 80))
	e.OnEndpointSliceAdd(testSlice("a", "a1", "10.0.0.1"))
	e.OnEndpointSliceAdd(testSlice("b", "b1", "10.0.0.2"))
	e.OnEndpointSliceAdd(testSlice("c", "c1", "10.0.0.3"))
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.got = []Frontend{
		{Addr: netip.MustParseAddr("10.96.0.1"), Protocol: model.TCP, Port: 80, Endpoints: []netip.AddrPort{ap("10.0.0.1:8080")}},
		{Addr: netip.MustParseAddr("10.96.0.2"), Protocol: model.TCP, Port: 80, Endpoints: []netip.AddrPort{ap("10.0.0.2:8080"), ap("10.0.0.9:8080")}},
		{Addr: netip.MustParseAddr("10.96.0.3"), Protocol: model.TCP, Port: 80, Endpoints: []netip.AddrPort{ap("10.0.0.3:8080")}},
		{Addr: netip.MustParseAddr("192.0.2.1"), Protocol: model.TCP, Port: 30080, Endpoints: []netip.AddrPort{ap("10.0.0.3:8080")}},
		{Addr: netip.MustParseAddr("192.0.2.2"), Protocol: model.TCP, Port: 30080},
		{Addr: netip.MustParseAddr("10.96.0.99"), Protocol: model.UDP, Port: 53, Verdict: "reject", Detail: "left over"},
	}
	b.mu.Unlock()
	r, err := e.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Families) != 1 || r.Backend != "recorder" {
		t.Fatalf("report %+v", r)
	}
	fr := r.Families[0]
	diffs := map[string]string{}
	for _, sr := range fr.Services {
		for _, f := range sr.Frontends {
			if !f.Read {
				t.Errorf("%s %s: not marked read", sr.Service, f.Kind)
			}
			diffs[sr.Service+" "+string(f.Kind)] = f.Diff
		}
	}
	want := map[string]string{
		"ns/a:p/TCP ClusterIP": "",
		"ns/b:p/TCP ClusterIP": "endpoints +10.0.0.9:8080",
		"ns/c:p/TCP ClusterIP": "",
		"ns/c:p/TCP NodePort":  "192.0.2.2 tcp/30080: endpoints -10.0.0.3:8080",
		"ns/d:p/TCP ClusterIP": "not programmed", // no endpoints: a reject, not read
	}
	for k, w := range want {
		if diffs[k] != w {
			t.Errorf("%s: diff %q, want %q", k, diffs[k], w)
		}
	}
	if len(fr.Unclaimed) != 1 || fr.Unclaimed[0].Frontend != "10.96.0.99 udp/53" {
		t.Errorf("unclaimed %+v, want the one left over", fr.Unclaimed)
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"ns/b:p/TCP  internal=Cluster",
		"DIFFERS: endpoints +10.0.0.9:8080",
		"ClusterIP    10.96.0.4 tcp/80 -> reject",
		"10.96.0.99 udp/53 -> reject  [left over]",
	} {
		if !strings.Contains(text.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, text.String())
		}
	}
}

// TestPlanWithoutSync checks that a planner computes, from the events
// alone, what a backend would be asked to program, kube-proxy's way:
// externalTrafficPolicy Local splits outside sources (local endpoints,
// or a drop) from pods and the node (every endpoint), and source ranges
// that hold the node admit the load-balancer IP itself.
func TestPlanWithoutSync(t *testing.T) {
	e, err := NewPlanner(Config{NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("198.51.100.1")}, Families: []model.IPFamily{model.IPv4}}, "nftables")
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	svc := nodePortService("lb", "10.96.0.5", 80, 30081)
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	e.OnServiceAdd(svc)
	e.OnEndpointSliceAdd(testSlice("lb", "lb1", "10.0.0.5"))
	if _, err := e.Plan(ctx); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("Plan before the initial lists: %v, want ErrNotSynced", err)
	}
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	r, err := e.Plan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Families) != 1 || len(r.Families[0].Services) != 1 {
		t.Fatalf("report %+v", r)
	}
	got := map[FrontendKind]FrontendJSON{}
	for _, f := range r.Families[0].Services[0].Frontends {
		if f.Read || f.Diff != "" || f.Got != nil {
			t.Errorf("%s: a plan reads nothing: %+v", f.Kind, f)
		}
		got[f.Kind] = f.Want
	}
	// The endpoint is on no node: remote, so outside sources are dropped.
	if w := got[KindClusterIP]; strings.Join(w.Endpoints, ",") != "10.0.0.5:8080" || w.Verdict != "" {
		t.Errorf("cluster IP %+v", w)
	}
	for _, k := range []FrontendKind{KindNodePort, KindLoadBalancer} {
		w := got[k]
		if len(w.Endpoints) != 0 || strings.Join(w.SomeSources, ",") != "10.0.0.5:8080" || w.Verdict != "drop" {
			t.Errorf("%s %+v, want the endpoint for some sources and a drop for the others", k, w)
		}
	}
	if w := got[KindLoadBalancer]; strings.Join(w.SourceRanges, ",") != "198.51.100.0/24,203.0.113.7/32" {
		t.Errorf("source ranges %v, want the range and the load-balancer IP (it holds the node)", w.SourceRanges)
	}
	if w := got[KindNodePort]; w.Frontend != "node-ports tcp/30081" || w.SourceRanges != nil {
		t.Errorf("node port %+v", w)
	}
}
