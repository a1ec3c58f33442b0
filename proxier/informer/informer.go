package informer

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxier"
)

// LabelServiceProxyName is the Service label that hands a Service to
// one service proxy (the one whose Config.ServiceProxyName it holds).
const LabelServiceProxyName = changetracker.LabelServiceProxyName

// Config says what to watch.
type Config struct {
	// NodeName is the node whose Node object is watched; empty watches
	// no Node.
	NodeName string
	// ServiceProxyName selects Services labelled
	// service.kubernetes.io/service-proxy-name with this value; empty
	// selects those without the label. Match it with the proxier's
	// Config.ServiceProxyName.
	ServiceProxyName string
	// Resync is the informers' resync period; zero disables it.
	Resync time.Duration
	// NoServiceCIDRs turns off the watch of networking.k8s.io/v1
	// ServiceCIDR objects (for API servers without that API, before
	// Kubernetes 1.33).
	NoServiceCIDRs bool
}

// Selector returns the label selector for Services and EndpointSlices:
// not headless, and with the given service-proxy-name (or none).
func Selector(serviceProxyName string) (labels.Selector, error) {
	noHeadless, err := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	var proxyName *labels.Requirement
	if serviceProxyName == "" {
		proxyName, err = labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	} else {
		proxyName, err = labels.NewRequirement(LabelServiceProxyName, selection.Equals, []string{serviceProxyName})
	}
	if err != nil {
		return nil, fmt.Errorf("service-proxy-name %q: %w", serviceProxyName, err)
	}
	return labels.NewSelector().Add(*noHeadless, *proxyName), nil
}

// Run starts informers on client, delivers their events to p, calls the
// Synced handlers once the initial lists are in, and blocks until ctx is
// done. It fails if the caches cannot sync before ctx ends. The objects
// it delivers are stripped of what no proxier reads (managed fields,
// owner references, most annotations, the Node's status but its
// addresses, ...) before they are cached.
func Run(ctx context.Context, client kubernetes.Interface, p proxier.Proxier, cfg Config) error {
	sel, err := Selector(cfg.ServiceProxyName)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	svcInf := factory.Core().V1().Services().Informer()
	sliceInf := factory.Discovery().V1().EndpointSlices().Informer()
	if err := svcInf.SetTransform(leanService); err != nil {
		return err
	}
	if err := sliceInf.SetTransform(leanSlice); err != nil {
		return err
	}
	// Synced waits for each handler to have received the initial list
	// (its registration's HasSynced), not only for the informer's store
	// to hold it: a store fills before its handlers have seen every
	// object, and a first sync then would program part of the cluster.
	var synced []cache.InformerSynced
	register := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return err
		}
		synced = append(synced, reg.HasSynced)
		return nil
	}
	if err := register(svcInf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { withService(o, p.OnServiceAdd) },
		UpdateFunc: func(a, b any) { withServices(a, b, p.OnServiceUpdate) },
		DeleteFunc: func(o any) { withService(o, p.OnServiceDelete) },
	}); err != nil {
		return err
	}
	if err := register(sliceInf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { withSlice(o, p.OnEndpointSliceAdd) },
		UpdateFunc: func(a, b any) { withSlices(a, b, p.OnEndpointSliceUpdate) },
		DeleteFunc: func(o any) { withSlice(o, p.OnEndpointSliceDelete) },
	}); err != nil {
		return err
	}
	var nodeFactory informers.SharedInformerFactory
	if cfg.NodeName != "" {
		nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, cfg.Resync,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
			}))
		nodeInf := nodeFactory.Core().V1().Nodes().Informer()
		if err := nodeInf.SetTransform(leanNode); err != nil {
			return err
		}
		if err := register(nodeInf, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { withNode(o, cfg.NodeName, p.OnNodeAdd) },
			UpdateFunc: func(a, b any) { withNodes(a, b, cfg.NodeName, p.OnNodeUpdate) },
			DeleteFunc: func(o any) { withNode(o, cfg.NodeName, p.OnNodeDelete) },
		}); err != nil {
			return err
		}
		nodeFactory.Start(ctx.Done())
	}
	var cidrFactory informers.SharedInformerFactory
	if !cfg.NoServiceCIDRs {
		// All ServiceCIDRs, whatever their labels: each event hands on
		// the whole list, as kube-proxy's ServiceCIDR handler does.
		cidrFactory = informers.NewSharedInformerFactory(client, cfg.Resync)
		cidrInf := cidrFactory.Networking().V1().ServiceCIDRs().Informer()
		changed := func() { p.OnServiceCIDRsChanged(serviceCIDRs(cidrInf.GetStore().List())) }
		if err := register(cidrInf, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { changed() },
			UpdateFunc: func(_, _ any) { changed() },
			DeleteFunc: func(any) { changed() },
		}); err != nil {
			return err
		}
		cidrFactory.Start(ctx.Done())
	}
	factory.Start(ctx.Done())
	defer func() {
		factory.Shutdown()
		if nodeFactory != nil {
			nodeFactory.Shutdown()
		}
		if cidrFactory != nil {
			cidrFactory.Shutdown()
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("informer: caches did not sync")
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnNodeSynced()
	<-ctx.Done()
	return nil
}

// serviceCIDRs returns the spec.cidrs of the ServiceCIDR objects in
// objs, without repeats; unparsable ones are left out (the API server
// validates them).
func serviceCIDRs(objs []any) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objs {
		sc, ok := o.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil && !slices.Contains(out, p.Masked()) {
				out = append(out, p.Masked())
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// unwrap returns the object inside a tombstone.
func unwrap(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}

func withService(o any, f func(*v1.Service)) {
	if s, ok := unwrap(o).(*v1.Service); ok {
		f(s)
	}
}

func withServices(a, b any, f func(_, _ *v1.Service)) {
	x, ok1 := a.(*v1.Service)
	y, ok2 := b.(*v1.Service)
	if ok1 && ok2 {
		f(x, y)
	}
}

func withSlice(o any, f func(*discoveryv1.EndpointSlice)) {
	if s, ok := unwrap(o).(*discoveryv1.EndpointSlice); ok {
		f(s)
	}
}

func withSlices(a, b any, f func(_, _ *discoveryv1.EndpointSlice)) {
	x, ok1 := a.(*discoveryv1.EndpointSlice)
	y, ok2 := b.(*discoveryv1.EndpointSlice)
	if ok1 && ok2 {
		f(x, y)
	}
}

// withNode and withNodes pass on only the named node, whatever the server
// did with the field selector.
func withNode(o any, name string, f func(*v1.Node)) {
	if n, ok := unwrap(o).(*v1.Node); ok && n.Name == name {
		f(n)
	}
}

func withNodes(a, b any, name string, f func(_, _ *v1.Node)) {
	x, ok1 := a.(*v1.Node)
	y, ok2 := b.(*v1.Node)
	if ok1 && ok2 && y.Name == name {
		f(x, y)
	}
}
