// Package proxier holds the [Proxier] interface every backend package
// returns, the [Backend] seam a dataplane implements, and the engine that
// joins them.
//
// The engine owns the change trackers (one per IP family), receives
// Service, EndpointSlice and Node events, selects the endpoints each service
// port may use on this node, and runs a bounded-frequency sync loop: at most
// one sync per minimum interval, a full resync every sync period, and a
// retry with backoff after a failure. On each sync it hands every backend
// the full desired state of its family plus what changed since that
// backend's last successful sync.
package proxier
