package changetracker

import (
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

// sliceID identifies an EndpointSlice.
type sliceID struct {
	Namespace, Name string
}

// sliceInfo is what the tracker keeps of an EndpointSlice that contributes
// endpoints to its family: only the fields it needs, already parsed.
type sliceInfo struct {
	svc       model.ServiceName
	name      string
	ports     []slicePort
	endpoints []sliceEndpoint
}

// dead reports whether the slice was replaced or removed since it was
// applied: applySlice then drops its ports, never empty before.
func (s *sliceInfo) dead() bool { return s.ports == nil }

type slicePort struct {
	name  string
	proto model.Protocol
	port  uint16
}

type sliceEndpoint struct {
	addr                        netip.Addr
	ready, serving, terminating bool
	node, zone                  string
	zoneHints, nodeHints        []string
}

// OnEndpointSlice records an EndpointSlice event: an add or update, or a
// delete when removed is set. The slice is neither kept nor modified.
//
// The slice belongs to the Service named by its kubernetes.io/service-name
// label, in its namespace; without that label it is ignored. Slices of
// address type FQDN or of the other family contribute nothing. Each port
// of the slice (a missing name means the unnamed port, a missing protocol
// TCP) gives the endpoints of that service port; only the first address of
// an endpoint is used, as in kube-proxy. Conditions
// are read as the API defines them (Ready unset means true, Serving unset
// means Ready, Terminating unset means false), and a Ready endpoint is
// always taken as Serving and not Terminating.
func (t *Tracker) OnEndpointSlice(slice *discoveryv1.EndpointSlice, removed bool) {
	if slice == nil {
		t.log.Warn("endpoint slice event without a slice")
		return
	}
	id := sliceID{Namespace: slice.Namespace, Name: slice.Name}
	var info *sliceInfo
	if !removed {
		info = t.parseSlice(slice)
	}
	if sliceInfoEqual(t.slices[id], info) {
		delete(t.slicePending, id)
		return
	}
	t.slicePending[id] = info
	t.slicePeak = max(t.slicePeak, len(t.slicePending))
}

// parseSlice converts slice into what the tracker keeps, or nil when it
// contributes no endpoint to the tracker's family.
func (t *Tracker) parseSlice(slice *discoveryv1.EndpointSlice) *sliceInfo {
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4:
		if t.family != model.IPv4 {
			return nil
		}
	case discoveryv1.AddressTypeIPv6:
		if t.family != model.IPv6 {
			return nil
		}
	case discoveryv1.AddressTypeFQDN:
		return nil
	default:
		t.log.Warn("unknown endpoint slice address type, slice ignored",
			"endpointSlice", slice.Namespace+"/"+slice.Name, "addressType", slice.AddressType)
		return nil
	}
	svcName, ok := slice.Labels[discoveryv1.LabelServiceName]
	if !ok || svcName == "" {
		t.log.Warn("endpoint slice without the "+discoveryv1.LabelServiceName+" label, ignored",
			"endpointSlice", slice.Namespace+"/"+slice.Name)
		return nil
	}
	info := &sliceInfo{
		svc:       model.ServiceName{Namespace: slice.Namespace, Name: svcName},
		name:      slice.Name,
		ports:     make([]slicePort, 0, len(slice.Ports)),
		endpoints: make([]sliceEndpoint, 0, len(slice.Endpoints)),
	}
	for i := range slice.Ports {
		if p, ok := t.parseSlicePort(info, &slice.Ports[i]); ok && !slices.Contains(info.ports, p) {
			info.ports = append(info.ports, p)
		}
	}
	if len(info.ports) == 0 {
		return nil
	}
	for i := range slice.Endpoints {
		if ep, ok := t.parseEndpoint(info, &slice.Endpoints[i]); ok {
			info.endpoints = append(info.endpoints, ep)
		}
	}
	if len(info.endpoints) == 0 {
		return nil
	}
	return info
}

func (t *Tracker) parseSlicePort(info *sliceInfo, p *discoveryv1.EndpointPort) (slicePort, bool) {
	var sp slicePort
	if p.Name != nil {
		sp.name = *p.Name
	}
	sp.proto = model.TCP
	if p.Protocol != nil {
		var ok bool
		if sp.proto, ok = protocol(*p.Protocol); !ok {
			t.log.Warn("unsupported endpoint port protocol, port ignored", "endpointSlice", info.svc.Namespace+"/"+info.name,
				"service", info.svc.String(), "port", sp.name, "protocol", *p.Protocol)
			return sp, false
		}
	}
	var num int32
	if p.Port != nil {
		num = *p.Port
	}
	var ok bool
	if sp.port, ok = validPort(num); !ok {
		t.log.Warn("endpoint port number missing or out of range, port ignored", "endpointSlice", info.svc.Namespace+"/"+info.name,
			"service", info.svc.String(), "port", sp.name, "number", num)
		return sp, false
	}
	return sp, true
}

func (t *Tracker) parseEndpoint(info *sliceInfo, ep *discoveryv1.Endpoint) (sliceEndpoint, bool) {
	var e sliceEndpoint
	if len(ep.Addresses) == 0 {
		t.log.Warn("endpoint without an address, ignored", "endpointSlice", info.svc.Namespace+"/"+info.name,
			"service", info.svc.String())
		return e, false
	}
	// As in kube-proxy, only the first address is used: the API says
	// consumers may treat the others as duplicates.
	a, err := parseAddr(ep.Addresses[0])
	if err == nil && !t.family.Contains(a) {
		err = errWrongFamily
	}
	if err != nil {
		t.log.Warn("invalid endpoint address, ignored", "endpointSlice", info.svc.Namespace+"/"+info.name,
			"service", info.svc.String(), "address", ep.Addresses[0], "err", err)
		return e, false
	}
	e.addr = a
	c := &ep.Conditions
	e.ready = c.Ready == nil || *c.Ready
	e.serving = e.ready
	if c.Serving != nil {
		e.serving = *c.Serving
	}
	e.terminating = c.Terminating != nil && *c.Terminating
	if e.ready {
		e.serving, e.terminating = true, false
	}
	if ep.NodeName != nil {
		e.node = *ep.NodeName
	}
	if ep.Zone != nil {
		e.zone = *ep.Zone
	}
	if h := ep.Hints; h != nil {
		for _, z := range h.ForZones {
			e.zoneHints = append(e.zoneHints, z.Name)
		}
		for _, n := range h.ForNodes {
			e.nodeHints = append(e.nodeHints, n.Name)
		}
	}
	return e, true
}

func sliceInfoEqual(a, b *sliceInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.svc == b.svc && a.name == b.name &&
		slices.Equal(a.ports, b.ports) &&
		slices.EqualFunc(a.endpoints, b.endpoints, func(x, y sliceEndpoint) bool {
			return x.addr == y.addr &&
				x.ready == y.ready && x.serving == y.serving && x.terminating == y.terminating &&
				x.node == y.node && x.zone == y.zone &&
				slices.Equal(x.zoneHints, y.zoneHints) &&
				slices.Equal(x.nodeHints, y.nodeHints)
		})
}
