#!/usr/bin/env bash
# Builds the two kube-proxy programs of the tests, at the pinned
# k8s.io/kubernetes version:
#   - kube-proxy-oracle: the upstream kube-proxy's proxiers
#     (pkg/proxy/nftables and pkg/proxy/iptables, at the version in
#     hack/kubeproxy/oracle/go.mod) behind a line protocol on stdin and
#     stdout, so that tests can program a network namespace exactly as
#     kube-proxy does (see hack/kubeproxy/oracle/main.go and
#     internal/kubeproxy);
#   - kube-proxy: the real upstream binary (cmd/kube-proxy, at the version
#     in hack/kubeproxy/kube-proxy/go.mod), which e2e's
#     TestKubeProxySideBySide runs next to examples/proxy.
# The binaries go into a cache directory outside the repository and are
# reused when they are already there; internal/kubeproxy and e2e find them
# by the same rules.
#
# Usage: hack/kubeproxy/build.sh [--force]
#   PROXYKIT_CACHE   cache directory (default /var/cache/proxykit)
#
# A cold build takes a few minutes on 2 cores (far less when
# hack/testcluster/build.sh has warmed the Go build cache). It prints the
# paths the tests use.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${PROXYKIT_CACHE:-/var/cache/proxykit}"
force=0
[ "${1:-}" = "--force" ] && force=1

log() { echo "hack/kubeproxy/build.sh: $*" >&2; }
# shellcheck source=../lib/k8sbuild.sh
. "$here/../lib/k8sbuild.sh"

# kube-proxy-oracle ---------------------------------------------------------
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

# kube-proxy ----------------------------------------------------------------
# Its main.go is upstream's, unchanged: the version names the binary.
src="$here/kube-proxy"
kp_version="$(k8s_version "$src")"
kp_out="$cache/kube-proxy-$kp_version"
if [ "$force" -eq 1 ] || [ ! -x "$kp_out" ]; then
	log "building kube-proxy $kp_version into $kp_out"
	k8s_build "$src" "$kp_version" "$kp_out"
fi

echo "kube-proxy-oracle=$out"
echo "kube-proxy=$kp_out"
