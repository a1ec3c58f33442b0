// Package backendtest builds the desired state the dataplane backends'
// tests and benchmarks sync: service ports with the targets the engine
// would select for them ([Svc], [ClusterSvc]), endpoints, and the
// [proxier.SyncRequest] a backend receives ([Request]), so that every
// backend's tests drive it with the same values the same way.
//
// [ScaleServices] turns the services of the scale benchmarks
// ([scale.Services], which the cross-backend benchmark tool feeds to
// whole proxiers) into backend-level service ports, so that a backend's
// own benchmarks measure the same input.
//
// Service ports built here are in the namespace [Namespace] (those of
// [ScaleServices] in [scale.Namespace]); every endpoint is ready and
// serving. The values are meant to be treated as immutable once in a
// request: the With methods return modified copies.
package backendtest
