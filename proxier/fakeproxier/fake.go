package fakeproxier

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/proxier"
)

// Events is a Proxier that records each event as a short line: "svc+ name",
// "svc~ name", "svc- name", "svc synced", likewise "eps" for
// EndpointSlices and "node" for Nodes, and "cidrs [PREFIXES]" for the
// service CIDRs. The zero value is ready to use; it is safe for
// concurrent use.
type Events struct {
	mu  sync.Mutex
	log []string
}

var _ proxier.Proxier = (*Events)(nil)

func (e *Events) add(s string) { e.mu.Lock(); e.log = append(e.log, s); e.mu.Unlock() }

// Has reports whether line was recorded.
func (e *Events) Has(line string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.log, line)
}

// Take returns the lines recorded since the last Take and forgets them.
func (e *Events) Take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.log
	e.log = nil
	return out
}

// Lines returns every line not yet taken.
func (e *Events) Lines() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.log)
}

// OnServiceAdd records "svc+ name".
func (e *Events) OnServiceAdd(s *v1.Service) { e.add("svc+ " + s.Name) }

// OnServiceUpdate records "svc~ name".
func (e *Events) OnServiceUpdate(_, s *v1.Service) { e.add("svc~ " + s.Name) }

// OnServiceDelete records "svc- name".
func (e *Events) OnServiceDelete(s *v1.Service) { e.add("svc- " + s.Name) }

// OnServiceSynced records "svc synced".
func (e *Events) OnServiceSynced() { e.add("svc synced") }

// OnEndpointSliceAdd records "eps+ name".
func (e *Events) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) { e.add("eps+ " + s.Name) }

// OnEndpointSliceUpdate records "eps~ name".
func (e *Events) OnEndpointSliceUpdate(_, s *discoveryv1.EndpointSlice) { e.add("eps~ " + s.Name) }

// OnEndpointSliceDelete records "eps- name".
func (e *Events) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) { e.add("eps- " + s.Name) }

// OnEndpointSlicesSynced records "eps synced".
func (e *Events) OnEndpointSlicesSynced() { e.add("eps synced") }

// OnNodeAdd records "node+ name".
func (e *Events) OnNodeAdd(n *v1.Node) { e.add("node+ " + n.Name) }

// OnNodeUpdate records "node~ name".
func (e *Events) OnNodeUpdate(_, n *v1.Node) { e.add("node~ " + n.Name) }

// OnNodeDelete records "node- name".
func (e *Events) OnNodeDelete(n *v1.Node) { e.add("node- " + n.Name) }

// OnNodeSynced records "node synced".
func (e *Events) OnNodeSynced() { e.add("node synced") }

// OnServiceCIDRsChanged implements [proxier.ServiceCIDRHandler].
func (e *Events) OnServiceCIDRsChanged(cidrs []netip.Prefix) {
	e.add(fmt.Sprintf("cidrs %v", cidrs))
}

// Sync does nothing.
func (e *Events) Sync() {}

// Flush returns nil.
func (e *Events) Flush(context.Context) error { return nil }

// Run returns nil.
func (e *Events) Run(context.Context) error { return nil }

// Cleanup returns nil.
func (e *Events) Cleanup(context.Context) error { return nil }

// Close returns nil.
func (e *Events) Close() error { return nil }
