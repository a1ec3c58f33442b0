package proxier

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

// ServiceHandler receives Service events. The objects are read, never kept
// or modified.
type ServiceHandler interface {
	// OnServiceAdd delivers a Service that is new.
	OnServiceAdd(svc *v1.Service)
	// OnServiceUpdate delivers a change of a Service: its previous and
	// its new version.
	OnServiceUpdate(oldSvc, svc *v1.Service)
	// OnServiceDelete delivers the last version of a deleted Service.
	OnServiceDelete(svc *v1.Service)
	// OnServiceSynced says the initial list of Services has been delivered.
	OnServiceSynced()
}

// EndpointSliceHandler receives EndpointSlice events.
type EndpointSliceHandler interface {
	// OnEndpointSliceAdd delivers an EndpointSlice that is new.
	OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice)
	// OnEndpointSliceUpdate delivers a change of an EndpointSlice: its
	// previous and its new version.
	OnEndpointSliceUpdate(oldSlice, slice *discoveryv1.EndpointSlice)
	// OnEndpointSliceDelete delivers the last version of a deleted
	// EndpointSlice.
	OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice)
	// OnEndpointSlicesSynced says the initial list of EndpointSlices has
	// been delivered.
	OnEndpointSlicesSynced()
}

// NodeHandler receives events of the node the proxier runs on (its labels
// carry the topology zone).
type NodeHandler interface {
	// OnNodeAdd delivers the node's Node object.
	OnNodeAdd(node *v1.Node)
	// OnNodeUpdate delivers a change of the node's Node object.
	OnNodeUpdate(oldNode, node *v1.Node)
	// OnNodeDelete says the node's Node object was deleted.
	OnNodeDelete(node *v1.Node)
	// OnNodeSynced says the initial list of Nodes has been delivered.
	OnNodeSynced()
}

// ServiceCIDRHandler receives the service CIDRs of the cluster: the
// spec.cidrs of every networking.k8s.io/v1 ServiceCIDR object, as
// kube-proxy's ServiceCIDR informer hands them on.
type ServiceCIDRHandler interface {
	// OnServiceCIDRsChanged replaces the whole list (both families).
	OnServiceCIDRsChanged(cidrs []netip.Prefix)
}

// Proxier is a service proxy: it takes Kubernetes objects and keeps a
// dataplane programmed to match them. Every backend package's New returns
// one. All methods are safe for concurrent use.
type Proxier interface {
	ServiceHandler
	EndpointSliceHandler
	NodeHandler
	ServiceCIDRHandler
	// Sync asks for a sync soon; calls within the minimum interval coalesce.
	Sync()
	// Flush waits until every event delivered before the call has been
	// programmed by a successful sync (triggering one if needed), or until
	// ctx is done. It is how a caller knows the dataplane caught up.
	Flush(ctx context.Context) error
	// Run runs the sync loop until ctx is done. The first sync waits until
	// both Services and EndpointSlices have been synced. Run returns nil
	// when ctx is done, and may be called once.
	Run(ctx context.Context) error
	// Cleanup removes everything the backend created. Call it after Run
	// has returned, or instead of Run.
	Cleanup(ctx context.Context) error
	// Close releases the proxier's handles without touching the
	// dataplane, which stays in place for a successor to adopt.
	Close() error
}

// Backend is the dataplane seam: one Backend programs one IP family of one
// network namespace. The engine calls its methods from one goroutine at a
// time, never concurrently.
type Backend interface {
	// Name is the backend's short name, e.g. "nftables"; it labels logs
	// and metrics.
	Name() string
	// Family is the IP family this backend programs.
	Family() model.IPFamily
	// Sync makes the dataplane match req. It returns nil when the
	// dataplane matches. On error the backend leaves the previous
	// dataplane in force where it can, and says so by wrapping
	// [ErrNotApplied]; the engine retries a failed partial sync at once
	// as a full one, and a failed full one later. Objects that cannot be
	// programmed are reported with an [*ObjectError] (joined with
	// errors.Join when several); the rest is still programmed, and the
	// engine logs them without retrying. Only a failure that belongs to
	// the object is an ObjectError: one caused by the dataplane's state
	// (a table or chain deleted behind the backend's back) fails the
	// sync.
	Sync(ctx context.Context, req *SyncRequest) error
	// Cleanup removes everything the backend ever created in its
	// namespace, whether this process created it or an earlier one.
	Cleanup(ctx context.Context) error
	// Close releases handles. It does not touch the dataplane.
	Close() error
}

// SyncRequest is what the engine hands a Backend. Its contents are
// immutable and must not be kept after Sync returns, except the
// *model.ServicePort and *model.Endpoint values it points to, which a
// backend may keep to compare with later requests.
type SyncRequest struct {
	// Full is set on the first sync, on the periodic resync and after a
	// failed sync: the backend must converge everything it owns, also
	// repairing changes made behind its back. When Full is false the
	// backend may limit its work to Changed.
	Full bool
	// State is the complete desired state of the family.
	State *model.State
	// Targets holds, for every service port in State.Services, the
	// endpoints selected for this node.
	Targets map[model.ServicePortName]*Targets
	// Changed names the service ports whose ServicePort or Targets
	// differ from the last successful sync, including ports that were
	// deleted (absent from State.Services).
	Changed map[model.ServicePortName]struct{}
	// NodeIPs are the node's addresses of this family, from the Node
	// object, when known.
	NodeIPs []netip.Addr
	// ServiceCIDRs are the service ranges of this family
	// (Config.ServiceCIDRs and the ServiceCIDR objects), masked, sorted
	// and without repeats. Traffic to an address in them that no
	// service holds is dropped where the backend can (as kube-proxy's
	// nftables mode does).
	ServiceCIDRs []netip.Prefix
}

// Targets are the endpoints traffic to one service port may go to on this
// node, after traffic policies, topology and the terminating fallback.
type Targets struct {
	// Internal receives cluster IP traffic. Empty with HasEndpoints set
	// means InternalTrafficPolicy Local without local endpoints: drop.
	Internal []*model.Endpoint
	// External receives node port, external IP and load-balancer
	// traffic. Empty with HasEndpoints set means ExternalTrafficPolicy
	// Local without local endpoints: drop.
	External []*model.Endpoint
	// HasEndpoints is false when the service has no usable endpoint
	// anywhere: its traffic is rejected.
	HasEndpoints bool
	// Cluster, when not nil, receives what pods and the node itself send
	// to the external addresses of a service with ExternalTrafficPolicy
	// Local (kube-proxy's short-circuit to its cluster policy): the
	// cluster-wide endpoints, where Internal has only the local ones
	// because InternalTrafficPolicy is Local too. Nil means Internal
	// serves that traffic. See [Targets.ShortCircuit].
	Cluster []*model.Endpoint
}

// ShortCircuit returns the endpoints that pods and the node itself reach
// through the external addresses of a service with ExternalTrafficPolicy
// Local: Cluster when set, else Internal.
func (t *Targets) ShortCircuit() []*model.Endpoint {
	if t.Cluster != nil {
		return t.Cluster
	}
	return t.Internal
}

// ErrNotApplied marks a sync error after which the kernel holds exactly
// what it held before the sync, e.g. a transaction the kernel rejected
// as a whole. Backends wrap it where they know this; the engine's log
// then says that the previous dataplane stays in force.
var ErrNotApplied = errors.New("nothing of the sync was applied")

// ObjectError is a failure to program one object. The rest of the sync
// went through.
type ObjectError struct {
	// Service is the service port that could not be programmed.
	Service model.ServicePortName
	// Err says why.
	Err error
}

// Error returns "namespace/name:port/PROTOCOL: reason".
func (e *ObjectError) Error() string { return e.Service.String() + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ObjectError) Unwrap() error { return e.Err }

// JoinObjectErrors returns one ObjectError per service port with a non-nil
// error in errMaps, sorted by name (see [model.ServicePortName.Compare]),
// joined with errors.Join; nil when there are none. Backends return it
// from Sync for the service ports they skipped.
func JoinObjectErrors(errMaps ...map[model.ServicePortName]error) error {
	var errs []error
	for _, m := range errMaps {
		for _, n := range slices.SortedFunc(maps.Keys(m), model.ServicePortName.Compare) {
			if m[n] != nil {
				errs = append(errs, &ObjectError{Service: n, Err: m[n]})
			}
		}
	}
	return errors.Join(errs...)
}

// OnlyObjectErrors reports whether err is nil or consists of
// [*ObjectError]s only (joined with errors.Join, at any depth): the sync
// went through for every other service port.
func OnlyObjectErrors(err error) bool {
	if err == nil {
		return true
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !OnlyObjectErrors(e) {
				return false
			}
		}
		return true
	}
	_, ok := err.(*ObjectError)
	return ok
}

// ErrNotSupported is matched (with errors.Is) by errors that say the kernel
// or the platform lacks something a backend needs.
var ErrNotSupported = errors.New("not supported")

// ErrCapacity is matched (with errors.Is) by errors that say a dataplane
// is too small for the desired state, e.g. a full BPF map: a setting of
// the backend must grow. The engine counts the service ports left out
// with an [*ObjectError] matching it in
// proxykit_service_port_over_capacity.
var ErrCapacity = errors.New("dataplane capacity exhausted")

// UnsupportedError says what a backend found missing on this node: a
// kernel feature, a program, a version. Every backend returns it for
// that, and it matches [ErrNotSupported].
type UnsupportedError struct {
	// Backend is the backend's name, e.g. "nftables".
	Backend string
	// What names what is missing, e.g. "nft_fib" or "program
	// ip6tables-nft-restore".
	What string
	// Err is the kernel's or the program's answer, if any.
	Err error
}

// Error names the backend and what it is missing.
func (e *UnsupportedError) Error() string {
	s := e.Backend + ": missing " + e.What
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches [ErrNotSupported].
func (e *UnsupportedError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns the underlying answer.
func (e *UnsupportedError) Unwrap() error { return e.Err }
