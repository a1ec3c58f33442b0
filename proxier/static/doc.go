// Package static feeds a Proxier from Kubernetes YAML instead of an API
// server: Services and EndpointSlices (and optionally the node's Node
// object), several documents per file, as `kubectl get -o yaml` or a
// hand-written manifest has them. It is the source for demos, tests and
// clusters-of-one.
//
// [Load] parses a file; [Source] delivers its objects to a Proxier and, when
// watching, compares the file again every interval and delivers the
// difference as add, update and delete events. [Parse] reports a document
// that does not parse with its position, kind and name, and returns the
// others; [Source] applies a file only when it parses completely and holds
// at least one document, so that a file caught half-written or truncated
// never deletes what it does not mention.
//
// Parsing YAML is slow (about 0.1 ms of CPU per object: seconds for tens
// of thousands of Services and EndpointSlices). With a cache directory
// ([Source.CacheDir], [LoadOptions.CacheDir]) a file that parsed
// completely leaves its objects there in the Kubernetes types' protobuf
// encoding, with the SHA-256 of its bytes, and a later read of the same
// bytes, such as a restarted process's, decodes them instead: the same
// objects (as equality.Semantic compares them), tens of times faster. A
// cache file that does not match (other bytes, another format, Go
// release or codec version, damaged) is logged and the file parsed.
package static
