#!/usr/bin/env bash
# Builds kube-proxy-oracle: the pinned upstream kube-proxy's proxiers
# (k8s.io/kubernetes pkg/proxy/nftables and pkg/proxy/iptables, at the
# version in hack/kubeproxy/oracle/go.mod) behind a line protocol on stdin
# and stdout, so that tests can program a network namespace exactly as
# kube-proxy does (see hack/kubeproxy/oracle/main.go and internal/kubeproxy).
# The binary goes into a cache directory outside the repository and is
# reused when it is already there; internal/kubeproxy finds it by the same
# rules.
#
# Usage: hack/kubeproxy/build.sh [--force]
#   PROXYKIT_CACHE   cache directory (default /var/cache/proxykit)
#
# A cold build takes a few minutes on 2 cores (far less when
# hack/testcluster/build.sh has warmed the Go build cache). It prints the
# path the tests use.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${PROXYKIT_CACHE:-/var/cache/proxykit}"
force=0
[ "${1:-}" = "--force" ] && force=1

log() { echo "hack/kubeproxy/build.sh: $*" >&2; }
# shellcheck source=../lib/k8sbuild.sh
. "$here/../lib/k8sbuild.sh"

src="$here/oracle"
version="$(k8s_version "$src")"
# The binary's name carries a digest of the oracle's sources, so a changed
# oracle is rebuilt on a machine whose cache holds an older one
# (internal/kubeproxy computes the same name: each of go.mod, go.sum and
# the .go files, in byte order, as its name, a newline and its content).
digest="$(cd "$src" && for f in $(ls go.mod go.sum *.go | LC_ALL=C sort); do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -c1-12)"
out="$cache/kube-proxy-oracle-$version-$digest"
if [ "$force" -eq 1 ] || [ ! -x "$out" ]; then
	log "building kube-proxy-oracle $version into $out"
	k8s_build "$src" "$version" "$out"
fi

echo "kube-proxy-oracle=$out"
