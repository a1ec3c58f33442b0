package iptables

import (
	"net/netip"
	"testing"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// testSvc is a service port with its targets.
type testSvc struct {
	sp *model.ServicePort
	t  *proxier.Targets
}

func spName(name, port string, p model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: name}, Port: port, Protocol: p}
}

func ep(s string) *model.Endpoint {
	return &model.Endpoint{Addr: netip.MustParseAddrPort(s), Ready: true, Serving: true}
}

func eps(ss ...string) []*model.Endpoint {
	var out []*model.Endpoint
	for _, s := range ss {
		out = append(out, ep(s))
	}
	return out
}

// clusterSvc is a ClusterIP service port balancing to endpoints (none:
// no endpoints at all).
func clusterSvc(name string, p model.Protocol, ip string, port uint16, endpoints ...string) testSvc {
	sp := &model.ServicePort{
		Name:      spName(name, "", p),
		ClusterIP: netip.MustParseAddr(ip),
		Port:      port,
		Protocol:  p,
	}
	e := eps(endpoints...)
	return testSvc{sp: sp, t: &proxier.Targets{Internal: e, External: e, HasEndpoints: len(e) > 0}}
}

// request builds a sync request of family f holding svcs. changed names
// the changed service ports of a partial request; Full is set when
// changed is nil.
func request(f model.IPFamily, svcs []testSvc, changed []model.ServicePortName) *proxier.SyncRequest {
	st := &model.State{Family: f, Services: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]*model.Endpoint{}}
	req := &proxier.SyncRequest{State: st, Targets: map[model.ServicePortName]*proxier.Targets{}, Changed: map[model.ServicePortName]struct{}{}}
	for _, s := range svcs {
		st.Services[s.sp.Name] = s.sp
		st.Endpoints[s.sp.Name] = append(append([]*model.Endpoint{}, s.t.Internal...), s.t.External...)
		req.Targets[s.sp.Name] = s.t
	}
	if changed == nil {
		req.Full = true
		for _, s := range svcs {
			req.Changed[s.sp.Name] = struct{}{}
		}
	}
	for _, n := range changed {
		req.Changed[n] = struct{}{}
	}
	return req
}

func svcNames(svcs ...testSvc) []model.ServicePortName {
	var out []model.ServicePortName
	for _, s := range svcs {
		out = append(out, s.sp.Name)
	}
	return out
}

// testRenderer returns a renderer of family f with the default prefix and
// cfg's options.
func testRenderer(t testing.TB, f model.IPFamily, cfg Config) *renderer {
	t.Helper()
	cfg = cfg.WithDefaults()
	n, err := newNames(cfg.ChainPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return newRenderer(cfg, f, n, true)
}

// offlineBackend is a backend that renders but runs nothing: enough for
// building restore inputs.
func offlineBackend(t testing.TB, f model.IPFamily, cfg Config) *backend {
	return &backend{cfg: cfg.WithDefaults(), fam: f, r: testRenderer(t, f, cfg), st: newState()}
}
