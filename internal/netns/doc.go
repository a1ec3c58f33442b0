// Package netns opens the network namespace a proxier is configured with and
// turns it into what each kernel library wants: a file descriptor for
// google/nftables, a netlink handle for vishvananda/netlink, and a locked
// goroutine for work that must run inside the namespace (exec, sockets).
//
// The caller's own namespace is never changed: code that must run inside
// another namespace runs on a dedicated OS thread, and a thread that cannot
// be switched back is discarded instead of being returned to the Go
// scheduler.
package netns
