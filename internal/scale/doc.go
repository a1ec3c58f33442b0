// Package scale generates the services of the scale benchmarks: plain
// service descriptions, the Kubernetes objects (Services and
// EndpointSlices) a proxier is fed, and the rule sets kube-proxy would
// write for them (kubeproxy.go), so that every dataplane and the
// kube-proxy references are measured on the same input.
//
// Addresses are from private ranges only: cluster IPs from 10.96.0.0/14
// (10.96.0.0/16 up to 65,526 services), endpoints from 10.64.0.0/12
// (10.64.0.0/13 up to 524,287 in all; routes that lead nowhere in the
// benchmark topology), replacement endpoints from 10.200.0.0/16, and the
// measured service [TargetIP], whose endpoints are real servers.
//
// A service's endpoints are split into EndpointSlices of at most
// [MaxSliceEndpoints], as the EndpointSlice controller splits them.
package scale
