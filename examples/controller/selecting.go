package main

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxykit/proxykit/proxier"
)

// selecting is a Proxier that passes on only the Services matching a label
// selector. An update that moves a Service into the selection becomes an
// add, one that moves it out a delete. EndpointSlices pass unchanged: the
// proxier ignores the slices of Services it does not know.
//
// (A controller that owns the label can use the standard one instead,
// service.kubernetes.io/service-proxy-name, with
// proxier.Config.ServiceProxyName and no wrapper.)
type selecting struct {
	proxier.Proxier
	selector labels.Selector
}

func (s *selecting) selected(svc *v1.Service) bool {
	return svc != nil && s.selector.Matches(labels.Set(svc.Labels))
}

// OnServiceAdd passes svc on if it is selected.
func (s *selecting) OnServiceAdd(svc *v1.Service) {
	if s.selected(svc) {
		s.Proxier.OnServiceAdd(svc)
	}
}

// OnServiceUpdate passes on an update, an add or a delete, as svc moves
// into, within or out of the selection.
func (s *selecting) OnServiceUpdate(old, svc *v1.Service) {
	switch was, is := s.selected(old), s.selected(svc); {
	case was && is:
		s.Proxier.OnServiceUpdate(old, svc)
	case is:
		s.Proxier.OnServiceAdd(svc)
	case was:
		s.Proxier.OnServiceDelete(old)
	}
}

// OnServiceDelete passes svc on if it was selected.
func (s *selecting) OnServiceDelete(svc *v1.Service) {
	if s.selected(svc) {
		s.Proxier.OnServiceDelete(svc)
	}
}
