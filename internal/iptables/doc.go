// Package iptables runs the host's iptables programs inside a network
// namespace: iptables-restore and ip6tables-restore for rule sets,
// iptables-save to read them back, iptables for single commands. Backends
// that program iptables (the iptables backend, the few rules of the IPVS
// backend) share it.
//
// # Flavours
//
// Since iptables 1.8 the same commands exist in two flavours that program
// different kernel interfaces: "legacy" (the x_tables blobs of ip_tables)
// and "nft" (nf_tables through the nft_compat expressions). Rules of one
// flavour are invisible to the other's tools, so a program must use the
// flavour the host already uses. [Detect] decides the way kube-proxy's
// iptables wrapper does: the flavour that holds our chains (or kubelet's
// hint chains), else the one with more rules, else nft.
//
// [FindTools] resolves the three binaries of one family and flavour and
// fails with a [*MissingError] naming the first one absent. A [Runner]
// runs them in a namespace: each call starts the program from a locked
// OS thread that entered the namespace (see internal/netns), so the child
// inherits it. Every call passes -w (wait for the xtables lock, which the
// legacy flavour takes) with a 100 ms polling interval.
//
// # Restore
//
// [Runner.Restore] feeds an input to *-restore --noflush. The program
// commits each table at its COMMIT line, so tables before a failing one
// stay committed and the failing table is left as it was. A failure is a
// [*RestoreError] carrying the input line the program named, so a caller
// can map it back to the object that produced it; its message holds that
// one line, the whole input only with %+v.
//
// The package holds no state besides what a Runner is given; it reads no
// environment variables (exec.LookPath reads PATH).
package iptables
