// Package changetracker turns Kubernetes Services and EndpointSlices into
// the backend-neutral [model.State] of one IP family, incrementally.
//
// A [Tracker] is fed events ([Tracker.OnService], [Tracker.OnEndpointSlice])
// and accumulates them as pending changes, merged per object: an add
// followed by a delete cancels out, a chain of updates keeps only the latest
// object, and a change that ends where it started is dropped. [Tracker.Apply]
// folds the pending changes into the tracker's State and returns a [Result]
// naming the service ports that changed and the conntrack entries that may
// have gone stale. The work done by an event and by Apply is proportional
// to what changed, never to the number of Services or endpoints tracked.
//
// The semantics follow kube-proxy's change trackers: headless and
// ExternalName Services are skipped, as are Services selected for another
// proxy by the service.kubernetes.io/service-proxy-name label;
// EndpointSlices of one Service are merged and their endpoints
// de-duplicated; addresses of the other IP family are left out. Malformed
// input is logged and the offending value (an address, a port, or the
// Service in this family) is dropped; it never panics and never affects
// other objects.
//
// # Contracts
//
// A Tracker is not safe for concurrent use: the caller serialises all calls,
// typically under the lock of the engine that owns it. Only Apply writes
// the State; the On* methods record pending changes and never touch it.
//
// The Service and EndpointSlice objects passed to the On* methods are read
// during the call only; they are neither kept nor modified.
//
// [Tracker.State] returns the tracker's own State. Its maps belong to the
// tracker: the caller must not modify them, and Apply updates them in
// place (an empty map may be replaced by a bigger one), so a caller that
// needs them after the next Apply (or concurrently with it) must copy
// them or hold the State instead. The values in those maps are different: a
// published *[model.ServicePort] and a published []*[model.Endpoint]
// (with every Endpoint and every slice reachable from them) are never
// modified again. Apply replaces them when they change and keeps them when
// they do not, so a backend may hold on to them across syncs and detect
// changes by comparing pointers.
//
// A [Result] belongs to the caller; the tracker keeps no reference to it.
package changetracker
