// Package fakeproxier has a Proxier that only records the events it gets,
// for testing sources (informers, static files) without a dataplane.
package fakeproxier
