// Package backends names every dataplane backend of proxykit (ebpf,
// iptables, ipvs, nftables), so a program can choose one by name (a
// --backend flag) with its options, and remove what any of them left
// behind (a --cleanup flag, or switching backends).
//
// [Config] is shaped like kube-proxy's KubeProxyConfiguration: the common
// [proxier.Config], then one section per backend holding that backend's
// own Config (masquerade bit and table name of nftables, chain prefix and
// flavour of iptables, scheduler of IPVS, cgroup, pin path and scheduler
// of eBPF, ...). [New] builds the named backend from the common part and
// its section. Zero values are the backends' defaults; only eBPF needs a
// value, Config.EBPF.CgroupPath. The load-balancing algorithm has one
// naming for every backend, [proxier.Scheduler]; a backend refuses one it
// does not implement with an error matching [proxier.ErrNotSupported].
//
// [CleanupAll] and [RemoveLeftovers] call each backend's own Cleanup
// function (nftables.Cleanup, iptables.Cleanup, ipvs.Cleanup,
// ebpf.Cleanup), which removes what the backend's proxiers left under the
// names its section gives, without building a proxier. They skip a
// backend this kernel cannot run, and refuse what a live proxier holds.
//
// Importing this package links every backend and its dependencies
// (cilium/ebpf among them); a program that needs one backend imports
// that backend's package instead.
package backends
