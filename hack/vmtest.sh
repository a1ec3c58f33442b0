#!/usr/bin/env bash
# Runs Go tests in a Debian kernel under qemu (software emulation), for
# kernel features the host lacks (IPVS, dummy interfaces) and to test on an
# older kernel (Debian 12: 6.1) than the host's:
#
#   hack/vmtest.sh [vmtest flags] PACKAGES... [-- TEST FLAGS...]
#   hack/vmtest.sh ./backends/ipvs/
#   hack/vmtest.sh -v ./backends/ipvs/ ./backends/nftables/ -- -run Conformance
#
# Prints go test's output (ok/FAIL per package, then "vmtest: N passed, N
# failed, N skipped") and exits non-zero when a test failed. Installs the
# Debian packages it needs if they are missing: qemu-system-x86,
# busybox-static, and the tools the tests run, which are copied into the
# VM (iproute2, nftables, iptables, conntrack). The kernel package
# is downloaded with apt-get download (never installed) and cached in
# $PROXYKIT_VMTEST_CACHE (default $XDG_CACHE_HOME/proxykit-vmtest or
# ~/.cache/proxykit-vmtest). Flags: go run ./internal/vmtest/cmd/vmtest -h.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

missing=()
# busybox-static: the VM's init must be statically linked (the plain
# busybox package is not).
for pkg in qemu-system-x86 busybox-static; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
for tool in ip:iproute2 nft:nftables iptables:iptables conntrack:conntrack; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "hack/vmtest.sh: installing ${missing[*]}" >&2
	sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	"${sudo[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

exec go run ./internal/vmtest/cmd/vmtest "$@"
