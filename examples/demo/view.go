package main

import (
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/proxier"
)

// view is a Proxier that passes every event on to the real one, keeps the
// objects it saw (so the demo knows what to probe) and says when they
// changed.
type view struct {
	proxier.Proxier

	mu       sync.Mutex
	gen      int // bumped by every event
	seq      int
	services map[string]*v1.Service
	order    map[string]int // first appearance, to print in file order
	slices   map[string]*discoveryv1.EndpointSlice
	changed  chan struct{} // one pending notification at most
}

func newView(p proxier.Proxier) *view {
	return &view{
		Proxier:  p,
		services: map[string]*v1.Service{},
		order:    map[string]int{},
		slices:   map[string]*discoveryv1.EndpointSlice{},
		changed:  make(chan struct{}, 1),
	}
}

func key(namespace, name string) string { return namespace + "/" + name }

func (v *view) update(f func()) {
	v.mu.Lock()
	f()
	v.gen++
	v.mu.Unlock()
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

func (v *view) setService(s *v1.Service) {
	k := key(s.Namespace, s.Name)
	if _, ok := v.order[k]; !ok {
		v.seq++
		v.order[k] = v.seq
	}
	v.services[k] = s
}

// OnServiceAdd records svc and passes it on.
func (v *view) OnServiceAdd(svc *v1.Service) {
	v.update(func() { v.setService(svc) })
	v.Proxier.OnServiceAdd(svc)
}

// OnServiceUpdate records svc and passes it on.
func (v *view) OnServiceUpdate(old, svc *v1.Service) {
	v.update(func() { v.setService(svc) })
	v.Proxier.OnServiceUpdate(old, svc)
}

// OnServiceDelete forgets svc and passes it on.
func (v *view) OnServiceDelete(svc *v1.Service) {
	v.update(func() { delete(v.services, key(svc.Namespace, svc.Name)) })
	v.Proxier.OnServiceDelete(svc)
}

// OnEndpointSliceAdd records slice and passes it on.
func (v *view) OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice) {
	v.update(func() { v.slices[key(slice.Namespace, slice.Name)] = slice })
	v.Proxier.OnEndpointSliceAdd(slice)
}

// OnEndpointSliceUpdate records slice and passes it on.
func (v *view) OnEndpointSliceUpdate(old, slice *discoveryv1.EndpointSlice) {
	v.update(func() { v.slices[key(slice.Namespace, slice.Name)] = slice })
	v.Proxier.OnEndpointSliceUpdate(old, slice)
}

// OnEndpointSliceDelete forgets slice and passes it on.
func (v *view) OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice) {
	v.update(func() { delete(v.slices, key(slice.Namespace, slice.Name)) })
	v.Proxier.OnEndpointSliceDelete(slice)
}

// generation counts the events so far.
func (v *view) generation() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gen
}

// snapshot returns the services in the order they first appeared, the
// EndpointSlices of each, by service key, and the generation they are of.
func (v *view) snapshot() ([]*v1.Service, map[string][]*discoveryv1.EndpointSlice, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	svcs := make([]*v1.Service, 0, len(v.services))
	for _, s := range v.services {
		svcs = append(svcs, s)
	}
	slices.SortFunc(svcs, func(a, b *v1.Service) int {
		return v.order[key(a.Namespace, a.Name)] - v.order[key(b.Namespace, b.Name)]
	})
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, sl := range v.slices {
		if name := sl.Labels[discoveryv1.LabelServiceName]; name != "" {
			k := key(sl.Namespace, name)
			bySvc[k] = append(bySvc[k], sl)
		}
	}
	for _, l := range bySvc {
		slices.SortFunc(l, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	}
	return svcs, bySvc, v.gen
}
