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
		old.ports = nil // dead: its candidates leave a merged list
		t.affected = append(t.affected, old.svc)
		e := t.svcs[old.svc]
		i := slices.Index(e.slices, old)
		if info != nil && info.svc == old.svc {
			e.slices[i] = info // replaced in place
			t.slices[id] = info
			e.fresh(info)
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
	e.fresh(info)
}

// fresh records a slice new to the Service for the merge of its
// candidates, if it keeps them.
func (e *svcEntry) fresh(info *sliceInfo) {
	if e.merged != nil {
		e.merged.fresh = append(e.merged.fresh, info)
	}
}

// candidate is one occurrence of an endpoint address in a slice, for one
// service port.
type candidate struct {
	port  int // index of the service port among the Service's ports
	addr  netip.AddrPort
	ep    *sliceEndpoint
	info  *sliceInfo // the slice, for its name
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
	if r := cmp.Compare(c.info.name, d.info.name); r != 0 {
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

// mergeMin is the number of candidates from which a Service of several
// slices keeps them sorted between Applies (in svcEntry.merged), so that
// a change to one of its slices costs time linear in its endpoints
// instead of a sort of all of them. A variable for the tests.
var mergeMin = 256

// mergedCands are the sorted candidates of a big Service as of the last
// Apply, kept so that the next one only sorts the candidates of the
// slices that changed and merges them in.
type mergedCands struct {
	// cands are sorted by compareCandidates, duplicates included.
	cands []candidate
	// ports give the service port of each candidate's port index: every
	// port the list had since it was built, some perhaps gone.
	ports portIndex
	// clusterIP is the cluster IP whose endpoints were left out.
	clusterIP netip.Addr
	// fresh are the slices applied since, whose candidates are not in
	// the list yet.
	fresh []*sliceInfo
}

// applyEndpoints rebuilds the endpoints of one Service from its slices and
// folds them into the state. It sorts all occurrences of the Service's
// endpoints by port and address, keeps the preferred one of each, and
// reuses the published Endpoint of every one that did not change. A big
// Service of several slices keeps its sorted occurrences, and only those
// of its changed slices are sorted and merged in (mergeChanged).
func (t *Tracker) applyEndpoints(svc model.ServiceName, res *Result) {
	e := t.svcs[svc]
	if e == nil {
		return // nothing applied, nothing to remove
	}
	// An endpoint at the Service's own cluster IP would loop.
	var clusterIP netip.Addr
	if len(e.ports) > 0 {
		clusterIP = e.ports[0].ClusterIP
	}
	// The service ports the slices have now.
	ports := portIndex{names: t.names[:0]}
	for _, info := range e.slices {
		for _, p := range info.ports {
			if n := (model.ServicePortName{ServiceName: svc, Port: p.name, Protocol: p.proto}); ports.find(n) < 0 {
				ports.add(n)
			}
		}
	}
	var cands []candidate
	names := &ports // the service port of each candidate's port index
	if m := e.merged; m != nil && m.clusterIP == clusterIP && len(e.slices) > 1 &&
		2*len(m.cands) >= mergeMin && len(m.ports.names) <= 2*len(ports.names)+8 {
		cands = t.mergeChanged(svc, m)
		names = &m.ports
	} else {
		e.merged = nil
		cands = t.collect(svc, e.slices, &ports, clusterIP, t.cands[:0])
		slices.SortFunc(cands, compareCandidates)
		if len(cands) >= mergeMin && len(e.slices) > 1 {
			e.merged = &mergedCands{cands: slices.Clone(cands), clusterIP: clusterIP}
			for _, n := range ports.names {
				e.merged.ports.add(n)
			}
		}
	}

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
		t.foldPort(names.names[cands[start].port], cands[start:end], res)
		start = end
	}
	if !sameNames(e.epPorts, &ports) {
		e.epPorts = slices.Clone(ports.names)
	}
	clear(ports.names)
	t.names = ports.names[:0]
	if names == &ports { // cands are the scratch list
		clear(cands) // drop references to slices that may go away
		t.cands = cands[:0]
	}
	t.gc(svc, e)
}

// collect appends the candidates of the slices infos of Service svc to
// cands, and leaves out the endpoints at clusterIP. ports gives the port
// indexes, and gets the ports it lacks.
func (t *Tracker) collect(svc model.ServiceName, infos []*sliceInfo, ports *portIndex, clusterIP netip.Addr,
	cands []candidate) []candidate {
	for _, info := range infos {
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
					port: pi, addr: netip.AddrPortFrom(ep.addr, p.port), ep: ep, info: info, index: i,
				})
			}
		}
	}
	return cands
}

// mergeChanged brings the merged candidates m of Service svc up to date
// and returns them: it drops the candidates of the slices that were
// replaced or removed (dead), sorts those of the fresh slices and merges
// the two sorted lists, in time linear in the Service's candidates plus
// the sort of the fresh ones.
func (t *Tracker) mergeChanged(svc model.ServiceName, m *mergedCands) []candidate {
	add := t.collect(svc, m.fresh, &m.ports, m.clusterIP, t.cands[:0])
	slices.SortFunc(add, compareCandidates)
	clear(m.fresh)
	m.fresh = m.fresh[:0]
	old := m.cands
	out := slices.Grow(t.spare[:0], len(old)+len(add))
	j := 0
	for i := range old {
		if old[i].info.dead() {
			continue
		}
		// No two candidates compare equal: a live slice is either
		// merged (in old) or fresh (in add).
		for j < len(add) && compareCandidates(add[j], old[i]) < 0 {
			out = append(out, add[j])
			j++
		}
		out = append(out, old[i])
	}
	out = append(out, add[j:]...)
	clear(add)
	t.cands = add[:0]
	// Keep the old list's array as the next merge's: every entry of a
	// spare array is zero. A spare much bigger than needed (of a bigger
	// Service) stays the spare.
	clear(old)
	if cap(out) > 2*len(out)+mergeMin {
		m.cands = slices.Clone(out)
		clear(out)
		t.spare = out[:0]
	} else {
		m.cands = out
		t.spare = old[:0]
	}
	return m.cands
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
// list in the state. It does not modify cands.
func (t *Tracker) foldPort(n model.ServicePortName, cands []candidate, res *Result) {
	// Keep the preferred occurrence of each address, the first, and match
	// them against the published list, both sorted by address.
	old := t.state.Endpoints[n]
	matched := t.matched[:0]
	missing, i := 0, 0
	for c := range cands {
		if c > 0 && cands[c-1].addr == cands[c].addr {
			continue // a less preferred occurrence
		}
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
	if missing == 0 && len(matched) == len(old) {
		clear(matched)
		t.matched = matched[:0]
		return // unchanged: keep the published list
	}
	eps := make([]*model.Endpoint, len(matched))
	vals := make([]model.Endpoint, missing) // one allocation for the new ones
	k := 0
	for c := range cands {
		if c > 0 && cands[c-1].addr == cands[c].addr {
			continue
		}
		if matched[k] != nil {
			eps[k] = matched[k]
		} else {
			v := &vals[0]
			vals = vals[1:]
			t.fillEndpoint(v, &cands[c])
			eps[k] = v
		}
		k++
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
