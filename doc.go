// Package proxykit is a Go SDK for building Kubernetes service proxies.
//
// It splits a service proxy into three parts that meet at small seams:
//
//   - Sources deliver Kubernetes objects: [github.com/proxykit/proxykit/proxier/informer]
//     wires client-go informers, [github.com/proxykit/proxykit/proxier/static]
//     reads YAML files. Anything else can call a Proxier's handlers itself.
//   - The change tracker ([github.com/proxykit/proxykit/changetracker]) turns
//     Services and EndpointSlices into a backend-neutral desired state
//     ([github.com/proxykit/proxykit/model]), incrementally, one IP family at
//     a time.
//   - The engine ([github.com/proxykit/proxykit/proxier]) selects the
//     endpoints each service may use on this node (traffic policies,
//     topology, terminating fallback), runs a rate-limited sync loop with
//     periodic full resyncs and retries, and hands a Backend the state plus
//     what changed. Backends program the kernel: see the packages under
//     backends/.
//
// A backend package's New returns a [github.com/proxykit/proxykit/proxier.Proxier]:
//
//	p, err := nftables.New(nftables.Config{Config: proxier.Config{NodeName: "node1"}})
//	if err != nil { ... }
//	go informer.Run(ctx, client, p, informer.Config{NodeName: "node1"})
//	err = p.Run(ctx)
//
// Every backend takes the network namespace to program in its Config, so one
// process can run several proxiers (one per pod network, say) without
// touching its own namespace. proxier/proxiertest holds the conformance
// suite that proves a backend with real traffic in throwaway namespaces.
//
// docs/ARCHITECTURE.md in the repository describes the architecture in
// more depth: the seams, the data flow from Services and EndpointSlices to
// the kernel, the sync loop, the import rule between packages and what
// each package owns.
package proxykit
