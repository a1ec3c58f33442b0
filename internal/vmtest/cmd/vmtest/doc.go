// Command vmtest runs the tests of Go packages in a Debian kernel under
// qemu and prints their results as go test does:
//
//	go run ./internal/vmtest/cmd/vmtest [flags] PACKAGES... [-- TEST FLAGS...]
//
// for example
//
//	go run ./internal/vmtest/cmd/vmtest ./backends/ipvs/ -- -run Conformance
//
// It exits 0 when every package passed, 1 when a test failed, and 2 when
// the run itself failed (no kernel, no qemu, a package that does not
// build is a test failure). The kernel is cached in $PROXYKIT_VMTEST_CACHE,
// else $XDG_CACHE_HOME/proxykit-vmtest, else ~/.cache/proxykit-vmtest
// (/var/cache/proxykit-vmtest for root without a home). hack/vmtest.sh
// installs qemu and busybox first and calls this command.
package main
