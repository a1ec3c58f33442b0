#!/usr/bin/env bash
# Runs the whole test suite. Privileged tests (network namespaces, real
# kernel dataplanes) need root; run this with sudo. Installs the few Debian
# packages the tests use to inspect the kernel if they are missing, and
# the control plane of the end-to-end tests (hack/testcluster/build.sh)
# and the kube-proxy oracle and binary (hack/kubeproxy/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "hack/test.sh: not root; privileged tests will skip (run with sudo to include them)" >&2
else
	export PROXYKIT_REQUIRE_PRIVILEGED=1
	missing=()
	# clang-19/llvm-19/libbpf-dev: the eBPF backend's test that the
	# committed objects match their C sources.
	for tool in ip:iproute2 nft:nftables iptables:iptables conntrack:conntrack \
		clang-19:clang-19 llvm-strip-19:llvm-19 /usr/include/bpf/bpf_helpers.h:libbpf-dev /usr/include/linux/bpf.h:linux-libc-dev; do
		t="${tool%%:*}"
		if [ "${t#/}" != "$t" ]; then [ -e "$t" ] || missing+=("${tool#*:}"); continue; fi
		command -v "$t" >/dev/null 2>&1 || missing+=("${tool#*:}")
	done
	if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "hack/test.sh: installing ${missing[*]}" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
	# The end-to-end tests (./e2e) run a real etcd and kube-apiserver:
	# etcd-server from apt, kube-apiserver built once into
	# /var/cache/proxykit (~8 min the first time, reused afterwards).
	hack/testcluster/build.sh >/dev/null
	# The kube-proxy oracle (kube-proxy's own proxiers, the reference of
	# TestKubeProxyDifferential) and the real kube-proxy binary (run next
	# to examples/proxy by TestKubeProxySideBySide), built the same way
	# (~20 s for both on a fresh machine after kube-apiserver, whose build
	# cache they share; measured: oracle 9 s, kube-proxy 9 s).
	hack/kubeproxy/build.sh >/dev/null
	# Test namespaces are bind-mounted in /run/netns, which is made a
	# shared mount point first (as `ip netns add` does), so that a
	# namespace's unmount reaches the copies of processes in other mount
	# namespaces (`ip netns exec`); internal/testnet does the same, and
	# doing it here first leaves no race with the tests' own `ip netns add`.
	mkdir -p /run/netns
	mount --make-shared /run/netns 2>/dev/null || { mount --bind /run/netns /run/netns && mount --make-shared /run/netns; }
fi

# The benchmark tool is a module of its own (so that the SDK's go.mod does
# not require its plotting library), which ./... does not enter: its tests
# (a 100-service smoke run as root) run after the SDK's, whatever those
# gave, and the script fails if either failed.
status=0
go test -count=1 -timeout 25m "$@" ./... || status=$?
go -C cmd/proxykit-bench test -count=1 -timeout 10m "$@" ./... || status=$?
exit "$status"
