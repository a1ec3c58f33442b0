package backendtest

import (
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Namespace is the namespace of the service ports [PortName] names.
const Namespace = "default"

// Svc is a service port with the targets selected for it: one entry of a
// [Request].
type Svc struct {
	// Port is the service port.
	Port *model.ServicePort
	// Targets are the endpoints its traffic may go to on this node.
	Targets *proxier.Targets
}

// PortName returns the name of port (empty: an unnamed port) of protocol
// p of the service name in [Namespace].
func PortName(name, port string, p model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: Namespace, Name: name}, Port: port, Protocol: p}
}

// Endpoint returns a ready, serving endpoint at addr, "ip:port"; it
// panics if addr does not parse.
func Endpoint(addr string) *model.Endpoint {
	return EndpointsAt(netip.MustParseAddrPort(addr))[0]
}

// Endpoints returns a ready, serving endpoint at each of addrs, "ip:port"
// strings; nil for none. It panics if one does not parse.
func Endpoints(addrs ...string) []*model.Endpoint {
	aps := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		aps[i] = netip.MustParseAddrPort(a)
	}
	return EndpointsAt(aps...)
}

// EndpointsAt returns a ready, serving endpoint at each of addrs; nil for
// none.
func EndpointsAt(addrs ...netip.AddrPort) []*model.Endpoint {
	var out []*model.Endpoint
	for _, a := range addrs {
		out = append(out, &model.Endpoint{Addr: a, Ready: true, Serving: true})
	}
	return out
}

// ClusterSvc returns a ClusterIP service port: the unnamed port of
// protocol p of the service name, listening on ip:port and balancing to
// endpoints ("ip:port" strings; none: no endpoints at all), the same
// targets for internal and external traffic. It panics if an address
// does not parse.
func ClusterSvc(name string, p model.Protocol, ip string, port uint16, endpoints ...string) Svc {
	aps := make([]netip.AddrPort, len(endpoints))
	for i, e := range endpoints {
		aps[i] = netip.MustParseAddrPort(e)
	}
	return ClusterSvcAt(name, p, netip.MustParseAddr(ip), port, aps...)
}

// ClusterSvcAt is [ClusterSvc] with parsed addresses.
func ClusterSvcAt(name string, p model.Protocol, ip netip.Addr, port uint16, endpoints ...netip.AddrPort) Svc {
	sp := &model.ServicePort{Name: PortName(name, "", p), ClusterIP: ip, Port: port, Protocol: p}
	e := EndpointsAt(endpoints...)
	return Svc{Port: sp, Targets: &proxier.Targets{Internal: e, External: e, HasEndpoints: len(e) > 0}}
}

// With returns s with a copy of its service port modified by f; the
// targets are shared.
func (s Svc) With(f func(sp *model.ServicePort)) Svc {
	sp := *s.Port
	f(&sp)
	return Svc{Port: &sp, Targets: s.Targets}
}

// WithTargets returns s with new targets: internal and external, and
// whether the service port has endpoints at all.
func (s Svc) WithTargets(internal, external []*model.Endpoint, has bool) Svc {
	return Svc{Port: s.Port, Targets: &proxier.Targets{Internal: internal, External: external, HasEndpoints: has}}
}

// WithAdded returns s with eps added after its internal targets, one
// list for internal and external traffic.
func (s Svc) WithAdded(eps ...*model.Endpoint) Svc {
	e := append(slices.Clone(s.Targets.Internal), eps...)
	return s.WithTargets(e, e, true)
}

// Names returns the names of the service ports of svcs.
func Names(svcs ...Svc) []model.ServicePortName {
	var out []model.ServicePortName
	for _, s := range svcs {
		out = append(out, s.Port.Name)
	}
	return out
}

// Request returns a sync request of family f whose desired state is
// svcs. changed names the changed service ports of an incremental
// request (it may name ports absent from svcs: deleted ones); when
// changed is nil the request is Full, with every port of svcs changed.
// The state's endpoints of a port are its internal targets followed by
// the external ones not among them.
func Request(f model.IPFamily, svcs []Svc, changed []model.ServicePortName) *proxier.SyncRequest {
	st := &model.State{Family: f, Services: make(map[model.ServicePortName]*model.ServicePort, len(svcs)), Endpoints: make(map[model.ServicePortName][]*model.Endpoint, len(svcs))}
	req := &proxier.SyncRequest{State: st, Targets: make(map[model.ServicePortName]*proxier.Targets, len(svcs)), Changed: map[model.ServicePortName]struct{}{}}
	for _, s := range svcs {
		eps := slices.Clone(s.Targets.Internal)
		for _, e := range s.Targets.External {
			if !slices.Contains(s.Targets.Internal, e) {
				eps = append(eps, e)
			}
		}
		st.Services[s.Port.Name] = s.Port
		st.Endpoints[s.Port.Name] = eps
		req.Targets[s.Port.Name] = s.Targets
	}
	if changed == nil {
		req.Full = true
		changed = Names(svcs...)
	}
	for _, n := range changed {
		req.Changed[n] = struct{}{}
	}
	return req
}
