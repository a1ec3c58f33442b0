package changetracker

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
)

// applySlice moves one pending slice into the applied set and records the
// Services whose endpoints must be rebuilt.
func (t *Tracker) applySlice(id sliceID, info *sliceInfo) {
	old := t.slices[id]
	if old != nil {
		t.affected = append(t.affected, old.svc)
		e := t.svcs[old.svc]
		i := slices.Index(e.slices, old)
		if info != nil && info.svc == old.svc {
			e.slices[i] = info // replaced in place
			t.slices[id] = info
			return
		}
		last := len(e.slices) - 1
		e.slices[i] = e.slices[last]
		e.slices[last] = nil
		e.slices = e.slices[:last]
		// The entry is collected by applyEndpoints, which always follows.
	}
	if info == nil {
		delete(t.slices, id)
		return
	}
	t.slices[id] = info
	t.affected = append(t.affected, info.svc)
	e := t.entry(info.svc)
	e.slices = append(e.slices, info)
}

// candidate is one occurrence of an endpoint address in a slice, for one
// service port.
type candidate struct {
	port  int // index of the service port among the Service's ports
	addr  netip.AddrPort
	ep    *sliceEndpoint
	slice string
	index int
}

// rank orders occurrences of one address: ready beats serving beats
// neither.
func (c *candidate) rank() int {
	switch {
	case c.ep.ready:
		return 2
	case c.ep.serving:
		return 1
	}
	return 0
}

// compareCandidates sorts candidates by service port and address and,
// among occurrences of one address, puts the preferred one first: the best
// rank, then the slice with the smallest name, then the earliest entry. So
// the result depends only on the slices, never on the order of events.
func compareCandidates(c, d candidate) int {
	// Field by field, stopping at the first that differs: cmp.Or would
	// evaluate all five, and the addresses nearly always differ.
	if c.port != d.port {
		return cmp.Compare(c.port, d.port)
	}
	if r := c.addr.Compare(d.addr); r != 0 {
		return r
	}
	if r := cmp.Compare(d.rank(), c.rank()); r != 0 {
		return r
	}
	if r := cmp.Compare(c.slice, d.slice); r != 0 {
		return r
	}
	return cmp.Compare(c.index, d.index)
}

// portIndex finds service port names in a short list, with a map once the
// list is long.
type portIndex struct {
	names []model.ServicePortName
	index map[model.ServicePortName]int
}

func (x *portIndex) find(n model.ServicePortName) int {
	if x.index != nil {
		if i, ok := x.index[n]; ok {
			return i
		}
		return -1
	}
	for i := range x.names {
		if x.names[i] == n {
			return i
		}
	}
	return -1
}

func (x *portIndex) add(n model.ServicePortName) int {
	i := len(x.names)
	x.names = append(x.names, n)
	switch {
	case x.index != nil:
		x.index[n] = i
	case len(x.names) > 8:
		x.index = make(map[model.ServicePortName]int, 2*len(x.names))
		for j, m := range x.names {
			x.index[m] = j
		}
	}
	return i
}

// applyEndpoints rebuilds the endpoints of one Service from its slices and
// folds them into the state. It sorts all occurrences of the Service's
// endpoints by port and address, keeps the preferred one of each, and
// reuses the published Endpoint of every one that did not change.
func (t *Tracker) applyEndpoints(svc model.ServiceName, res *Result) {
	e := t.svcs[svc]
	if e == nil {
		return // nothing applied, nothing to remove
	}
	ports := portIndex{names: t.names[:0]}
	cands := t.cands[:0]
	// An endpoint at the Service's own cluster IP would loop.
	var clusterIP netip.Addr
	if len(e.ports) > 0 {
		clusterIP = e.ports[0].ClusterIP
	}
	for _, info := range e.slices {
		for _, p := range info.ports {
			n := model.ServicePortName{ServiceName: svc, Port: p.name, Protocol: p.proto}
			pi := ports.find(n)
			if pi < 0 {
				pi = ports.add(n)
			}
			for i := range info.endpoints {
				ep := &info.endpoints[i]
				if clusterIP.IsValid() && ep.addr == clusterIP {
					t.log.Warn("endpoint at the service's own cluster IP, ignored", "endpointSlice", svc.Namespace+"/"+info.name,
						"service", svc.String(), "address", ep.addr.String())
					continue
				}
				cands = append(cands, candidate{
					port: pi, addr: netip.AddrPortFrom(ep.addr, p.port), ep: ep, slice: info.name, index: i,
				})
			}
		}
	}
	slices.SortFunc(cands, compareCandidates)

	for _, n := range e.epPorts {
		if ports.find(n) >= 0 {
			continue
		}
		old := t.state.Endpoints[n]
		delete(t.state.Endpoints, n)
		res.Changed[n] = struct{}{}
		detectStale(n, old, nil, res)
	}
	for start := 0; start < len(cands); {
		end := start + 1
		for end < len(cands) && cands[end].port == cands[start].port {
			end++
		}
		t.foldPort(ports.names[cands[start].port], cands[start:end], res)
		start = end
	}
	if !sameNames(e.epPorts, &ports) {
		e.epPorts = slices.Clone(ports.names)
	}
	clear(ports.names)
	t.names = ports.names[:0]
	t.gc(svc, e)
	clear(cands) // drop references to slices that may go away
	t.cands = cands[:0]
}

// sameNames reports whether names holds exactly the names in x.
func sameNames(names []model.ServicePortName, x *portIndex) bool {
	if len(names) != len(x.names) {
		return false
	}
	for _, n := range names {
		if x.find(n) < 0 {
			return false
		}
	}
	return true
}

// foldPort makes the sorted candidates of one service port its endpoint
// list in the state.
func (t *Tracker) foldPort(n model.ServicePortName, cands []candidate, res *Result) {
	// Keep the preferred occurrence of each address: the first.
	k := 0
	for i := range cands {
		if k > 0 && cands[k-1].addr == cands[i].addr {
			continue
		}
		cands[k] = cands[i]
		k++
	}
	cands = cands[:k]

	// Match against the published list, both sorted by address.
	old := t.state.Endpoints[n]
	matched := t.matched[:0]
	missing, i := 0, 0
	for c := range cands {
		for i < len(old) && old[i].Addr.Compare(cands[c].addr) < 0 {
			i++
		}
		if i < len(old) && old[i].Addr == cands[c].addr && t.sameEndpoint(old[i], &cands[c]) {
			matched = append(matched, old[i])
			i++
			continue
		}
		matched = append(matched, nil)
		missing++
	}
	if missing == 0 && len(cands) == len(old) {
		clear(matched)
		t.matched = matched[:0]
		return // unchanged: keep the published list
	}
	eps := make([]*model.Endpoint, len(cands))
	vals := make([]model.Endpoint, missing) // one allocation for the new ones
	for c := range cands {
		if matched[c] != nil {
			eps[c] = matched[c]
			continue
		}
		v := &vals[0]
		vals = vals[1:]
		t.fillEndpoint(v, &cands[c])
		eps[c] = v
	}
	clear(matched)
	t.matched = matched[:0]
	t.state.Endpoints[n] = eps
	res.Changed[n] = struct{}{}
	detectStale(n, old, eps, res)
}

func (t *Tracker) fillEndpoint(e *model.Endpoint, c *candidate) {
	*e = model.Endpoint{
		Addr:        c.addr,
		Ready:       c.ep.ready,
		Serving:     c.ep.serving,
		Terminating: c.ep.terminating,
		NodeName:    c.ep.node,
		Zone:        c.ep.zone,
		Local:       t.isLocal(c.ep.node),
		ZoneHints:   c.ep.zoneHints,
		NodeHints:   c.ep.nodeHints,
	}
}

// sameEndpoint reports whether e is what fillEndpoint would make of c.
func (t *Tracker) sameEndpoint(e *model.Endpoint, c *candidate) bool {
	return e.Addr == c.addr &&
		e.Ready == c.ep.ready &&
		e.Serving == c.ep.serving &&
		e.Terminating == c.ep.terminating &&
		e.NodeName == c.ep.node &&
		e.Zone == c.ep.zone &&
		e.Local == t.isLocal(c.ep.node) &&
		slices.Equal(e.ZoneHints, c.ep.zoneHints) &&
		slices.Equal(e.NodeHints, c.ep.nodeHints)
}

func (t *Tracker) isLocal(node string) bool { return node != "" && node == t.nodeName }

// detectStale records the conntrack consequences of a connectionless
// service port's endpoints going from old to cur.
func detectStale(n model.ServicePortName, old, cur []*model.Endpoint, res *Result) {
	if !n.Protocol.Connectionless() {
		return
	}
	oldServing, curServing := 0, 0
	for _, e := range old {
		if !e.Serving {
			continue
		}
		oldServing++
		i, found := slices.BinarySearchFunc(cur, e.Addr, func(x *model.Endpoint, a netip.AddrPort) int {
			return x.Addr.Compare(a)
		})
		if !found || !cur[i].Serving {
			res.StaleEndpoints = append(res.StaleEndpoints, StaleEndpoint{Service: n, Endpoint: e.Addr})
		}
	}
	for _, e := range cur {
		if e.Serving {
			curServing++
		}
	}
	if oldServing == 0 && curServing > 0 {
		res.StaleServices = append(res.StaleServices, n)
	}
}
