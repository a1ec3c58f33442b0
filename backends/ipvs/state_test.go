package ipvs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// plan runs planState with node addresses given: from nothing for a Full
// request, else updating prev in place.
func plan(t *testing.T, prev *state, req *proxier.SyncRequest, nodeAddrs ...string) (*state, *change) {
	t.Helper()
	if req.Full || prev == nil {
		prev = newState()
	}
	return prev, planState(prev, req, testRenderer(req.State.Family, nodeAddrs...), !req.Full)
}

func summary(c *change) string {
	var b []string
	for _, v := range c.newVS {
		b = append(b, "new "+v.Key.String())
	}
	for _, u := range c.updateVS {
		b = append(b, "update "+u[1].Key.String())
	}
	for _, v := range c.delVS {
		b = append(b, "del "+v.Key.String())
	}
	for _, a := range c.addAddrs {
		b = append(b, "bind "+a.String())
	}
	for _, a := range c.delAddrs {
		b = append(b, "unbind "+a.String())
	}
	for _, e := range c.addElems {
		b = append(b, "+"+e.String())
	}
	for _, e := range c.delElems {
		b = append(b, "-"+e.String())
	}
	return strings.Join(b, "\n")
}

func TestIncrementalTouchesOnlyChanged(t *testing.T) {
	a := clusterSvc("a", model.TCP, "10.96.0.1", 80, "10.244.1.2:8080")
	b := clusterSvc("b", model.TCP, "10.96.0.2", 80, "10.244.1.3:8080")
	st, _ := plan(t, nil, request(model.IPv4, []svc{a, b}))

	// An endpoint added to a: one update, one hairpin element.
	a2 := a.WithTargets(eps("10.244.1.2:8080", "10.244.2.2:8080"), eps("10.244.1.2:8080", "10.244.2.2:8080"), true)
	st2, c := plan(t, st, request(model.IPv4, []svc{a2, b}, a.Port.Name))
	if got, want := summary(c), "update 10.96.0.1:80/TCP\n+hairpin 10.244.2.2 . 10.244.2.2"; got != want {
		t.Errorf("change:\n%s\nwant:\n%s", got, want)
	}
	if len(c.objErrs) > 0 {
		t.Errorf("errors: %v", c.objErrs)
	}
	if len(st.vs[vsKey{netip.MustParseAddr("10.96.0.1"), model.TCP, 80}].Dests) != 2 {
		t.Error("the state lacks the new endpoint")
	}

	// b deleted: its virtual server, address and elements go.
	st3, c := plan(t, st2, request(model.IPv4, []svc{a2}, b.Port.Name))
	want := "del 10.96.0.2:80/TCP\nunbind 10.96.0.2\n-cluster 10.96.0.2:80/TCP\n-hairpin 10.244.1.3 . 10.244.1.3\n-service-addrs 10.96.0.2\n-virtual 10.96.0.2:80/TCP"
	if got := summary(c); got != want {
		t.Errorf("change:\n%s\nwant:\n%s", got, want)
	}
	if len(st3.services) != 1 || len(st3.vs) != 1 || len(st3.addrs) != 1 {
		t.Errorf("state after delete: %d services, %d virtual servers, %d addresses", len(st3.services), len(st3.vs), len(st3.addrs))
	}

	// Nothing changed: nothing to do.
	_, c = plan(t, st3, request(model.IPv4, []svc{a2}, a.Port.Name))
	if !c.empty() {
		t.Errorf("unchanged service produced:\n%s", summary(c))
	}
}

func TestSharedElementsAreCounted(t *testing.T) {
	// Two ports of one service share the address and an endpoint.
	a := clusterSvc("s", model.TCP, "10.96.0.1", 80, "10.244.1.2:8080")
	u := clusterSvc("s", model.UDP, "10.96.0.1", 53, "10.244.1.2:5353")
	st, _ := plan(t, nil, request(model.IPv4, []svc{a, u}))
	if st.addrs[netip.MustParseAddr("10.96.0.1")] != 2 {
		t.Fatalf("address count %d", st.addrs[netip.MustParseAddr("10.96.0.1")])
	}
	_, c := plan(t, st, request(model.IPv4, []svc{a}, u.Port.Name))
	if got := summary(c); strings.Contains(got, "unbind") || strings.Contains(got, "hairpin") || strings.Contains(got, "service-addrs") {
		t.Errorf("removing one port released shared objects:\n%s", got)
	}
}

func TestVirtualServerMovesBetweenPorts(t *testing.T) {
	a := clusterSvc("a", model.TCP, "10.96.0.1", 80, "10.244.1.2:8080")
	st, _ := plan(t, nil, request(model.IPv4, []svc{a}))
	// a is deleted and b takes its address and port in the same sync.
	b := clusterSvc("b", model.TCP, "10.96.0.1", 80, "10.244.1.3:8080")
	st2, c := plan(t, st, request(model.IPv4, []svc{b}, a.Port.Name, b.Port.Name))
	if len(c.objErrs) > 0 {
		t.Fatalf("errors: %v", c.objErrs)
	}
	if got := summary(c); !strings.HasPrefix(got, "update 10.96.0.1:80/TCP") || strings.Contains(got, "del ") || strings.Contains(got, "bind") {
		t.Errorf("change:\n%s", got)
	}
	if st2.owner[vsKey{netip.MustParseAddr("10.96.0.1"), model.TCP, 80}] != b.Port.Name {
		t.Error("owner not moved")
	}
}

func TestConflictReported(t *testing.T) {
	a := clusterSvc("a", model.TCP, "10.96.0.1", 80, "10.244.1.2:8080")
	b := clusterSvc("b", model.TCP, "10.96.0.1", 80, "10.244.1.3:8080")
	st, c := plan(t, nil, request(model.IPv4, []svc{a, b}))
	if err := c.objErrs[b.Port.Name]; err == nil || !strings.Contains(err.Error(), "default/a") {
		t.Errorf("conflict error: %v", err)
	}
	if len(st.services) != 1 {
		t.Errorf("%d services programmed", len(st.services))
	}
	var oe *proxier.ObjectError
	if err := proxier.JoinObjectErrors(c.objErrs); !errors.As(err, &oe) || oe.Service != b.Port.Name {
		t.Errorf("joined: %v", err)
	}
}

func TestNodeAddressChangeReplansNodePorts(t *testing.T) {
	np := clusterSvc("np", model.TCP, "10.96.0.1", 80, "10.244.1.2:8080").With(func(sp *model.ServicePort) { sp.NodePort = 30080 })
	other := clusterSvc("other", model.TCP, "10.96.0.2", 80, "10.244.1.2:8080")
	st, _ := plan(t, nil, request(model.IPv4, []svc{np, other}), "192.0.2.1")
	// Nothing changed but the node got an address.
	_, c := plan(t, st, request(model.IPv4, []svc{np, other}, model.ServicePortName{}), "192.0.2.1", "198.51.100.1")
	if got, want := summary(c), "new 198.51.100.1:30080/TCP\n+masq-external 198.51.100.1:30080/TCP\n+virtual 198.51.100.1:30080/TCP"; got != want {
		t.Errorf("change:\n%s\nwant:\n%s", got, want)
	}
}
