#!/usr/bin/env bash
# Runs the whole test suite. Privileged tests (network namespaces, real
# kernel dataplanes) need root; run this with sudo. Installs the few Debian
# packages the tests use to inspect the kernel if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "hack/test.sh: not root; privileged tests will skip (run with sudo to include them)" >&2
else
	export PROXYKIT_REQUIRE_PRIVILEGED=1
	missing=()
	for tool in ip:iproute2 nft:nftables iptables:iptables conntrack:conntrack ipset:ipset; do
		command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
	done
	if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "hack/test.sh: installing ${missing[*]}" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
fi

go test -count=1 -timeout 25m "$@" ./...
