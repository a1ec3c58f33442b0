// Package static feeds a Proxier from Kubernetes YAML instead of an API
// server: Services and EndpointSlices (and optionally the node's Node
// object), several documents per file, as `kubectl get -o yaml` or a
// hand-written manifest has them. It is the source for demos, tests and
// clusters-of-one.
//
// [Load] parses a file; [Source] delivers its objects to a Proxier and, when
// watching, compares the file again every interval and delivers the
// difference as add, update and delete events. A document that does not
// parse is reported with its position and skipped; the others still load.
package static
