// Package model is the backend-neutral desired state of a service proxy.
//
// A [ServicePort] describes one port of one Service as a dataplane sees it:
// the virtual addresses it is reached on (cluster IP, node port, external
// IPs, load-balancer ingress IPs), its protocol and the policies that shape
// where traffic may go. An [Endpoint] is one backend address of a service
// port. A [State] is the full set of both, for one IP family.
//
// The package imports nothing from Kubernetes: any source (the change tracker
// fed by informers, a static file, a non-Kubernetes control plane) can build
// a State, and any backend can program one.
//
// Values handed to a backend are immutable: neither the producer nor the
// backend modifies a ServicePort, an Endpoint or a slice reachable from one
// after it has been handed over. A producer that changes something builds a
// new value, so a backend may keep pointers from an earlier sync and compare
// them with the new ones.
package model
