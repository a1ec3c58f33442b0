// Package informer wires a Proxier to a Kubernetes API server through
// client-go shared informers: Services and EndpointSlices with the label
// selectors kube-proxy uses, and the proxier's own Node for its topology
// labels. Events flow into the Proxier's handlers; once each informer's
// initial list is in, the matching Synced handler is called, which lets
// the proxier's first sync start.
package informer
