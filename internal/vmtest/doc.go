// Package vmtest runs Go test binaries on a second, real kernel: Debian's
// (6.1 on Debian 12) under qemu with software emulation, for the kernel
// features the host lacks (IPVS, dummy interfaces) and to catch
// assumptions about newer kernels.
//
// [Run] builds the test binaries of some packages with CGO_ENABLED=0 go
// test -c, packs an initramfs (newc cpio, written here) holding a static
// busybox as init, the kernel modules the tests need and the host's ip,
// nft, iptables and conntrack programs with their shared libraries,
// boots the kernel with qemu-system-x86_64 -accel tcg, and runs each
// binary with -test.v=test2json. The binaries and their results travel
// through a 9p share (-virtfs); the module's source tree is shared
// read-only at its host path, so tests run in their package directory as
// under go test. The host follows the results while the VM writes them,
// converts them with go tool test2json, and prints them as go test does
// (text or -json). An outer timeout kills a hung VM.
//
// The kernel comes from Debian's package archive: [FetchKernel] asks apt
// which package linux-image-amd64 depends on, downloads it with apt-get
// download (it is never installed), extracts the image and the network,
// 9p and virtio modules with dpkg-deb --fsys-tarfile, and indexes them
// with busybox depmod. The result is cached per package version.
//
// The command internal/vmtest/cmd/vmtest and the script hack/vmtest.sh
// (which installs qemu-system-x86 and busybox-static first) wrap Run. This
// is test tooling: unlike library code, the command reads environment
// variables (the cache location).
package vmtest
