package backendtest

import (
	"net/netip"

	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// ScaleServices returns the service ports of [scale.Services](n, eps), in
// order, each as [FromScale] makes it: n TCP ClusterIP service ports
// with eps endpoints each, every tenth with a node port while the node
// port range lasts (see [scale.MaxNodePorts]), all addresses unique.
func ScaleServices(n, eps int) []Svc {
	svcs := scale.Services(n, eps)
	out := make([]Svc, len(svcs))
	for i, s := range svcs {
		out[i] = FromScale(s)
	}
	return out
}

// FromScale returns the service port of s, port [scale.PortName] of
// service s.Name in [scale.Namespace], with the targets the engine
// selects on a node other than the endpoints': all of them, one list for
// internal and external traffic.
func FromScale(s scale.Service) Svc {
	eps := make([]*model.Endpoint, len(s.Endpoints))
	for j, a := range s.Endpoints {
		eps[j] = &model.Endpoint{Addr: netip.AddrPortFrom(a, scale.TargetPort), Ready: true, Serving: true, NodeName: s.EndpointNode}
	}
	sp := &model.ServicePort{
		Name:      model.ServicePortName{ServiceName: model.ServiceName{Namespace: scale.Namespace, Name: s.Name}, Port: scale.PortName, Protocol: model.TCP},
		ClusterIP: s.ClusterIP,
		Port:      scale.Port,
		Protocol:  model.TCP,
		NodePort:  s.NodePort,
	}
	return Svc{Port: sp, Targets: &proxier.Targets{Internal: eps, External: eps, HasEndpoints: len(eps) > 0}}
}
