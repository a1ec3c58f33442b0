package ipvs

import (
	"net/netip"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func spName(name string, p model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: name}, Protocol: p}
}

func eps(ss ...string) []*model.Endpoint {
	var out []*model.Endpoint
	for _, s := range ss {
		out = append(out, &model.Endpoint{Addr: netip.MustParseAddrPort(s), Ready: true, Serving: true})
	}
	return out
}

// svc is a service port with its targets, for tests.
type svc struct {
	sp *model.ServicePort
	t  *proxier.Targets
}

// clusterSvc is a ClusterIP service port balancing to endpoints (none:
// no endpoints at all).
func clusterSvc(name string, p model.Protocol, ip string, port uint16, endpoints ...string) svc {
	e := eps(endpoints...)
	return svc{
		sp: &model.ServicePort{Name: spName(name, p), ClusterIP: netip.MustParseAddr(ip), Port: port, Protocol: p},
		t:  &proxier.Targets{Internal: e, External: e, HasEndpoints: len(e) > 0},
	}
}

func (s svc) with(f func(sp *model.ServicePort)) svc {
	cp := *s.sp
	f(&cp)
	return svc{sp: &cp, t: s.t}
}

func (s svc) targets(internal, external []*model.Endpoint, has bool) svc {
	return svc{sp: s.sp, t: &proxier.Targets{Internal: internal, External: external, HasEndpoints: has}}
}

// request builds a sync request of family f holding svcs; changed names
// the changed service ports of an incremental request; Full is set when
// changed is nil.
func request(f model.IPFamily, svcs []svc, changed ...model.ServicePortName) *proxier.SyncRequest {
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

func testRenderer(f model.IPFamily, nodeAddrs ...string) *renderer {
	r := &renderer{fam: f, scheduler: "rr", affinityTO: DefaultAffinityTimeout}
	for _, a := range nodeAddrs {
		r.nodeAddrs = append(r.nodeAddrs, netip.MustParseAddr(a))
	}
	return r
}

var _ = time.Second
