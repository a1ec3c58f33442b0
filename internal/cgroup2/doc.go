// Package cgroup2 finds the cgroup v2 hierarchy and makes cgroups of a
// program's own in it: the eBPF backend's socket programs attach to a
// cgroup, and the demo, the benchmarks and the tests run them on one they
// create instead of on a cgroup of the machine's.
package cgroup2
