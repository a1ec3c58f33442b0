// Package fakeproxier has a [proxier.Proxier] that only records the events
// it gets, for tests of sources and controllers that feed a Proxier
// (informers, static files, a CNI agent's own watcher) without a
// dataplane or root: feed it, then ask [Events.Has], [Events.Lines] or
// [Events.Take] what arrived.
package fakeproxier
