#!/usr/bin/env bash
# Provides the control plane that the end-to-end tests (./e2e) start on
# loopback:
#   - etcd, from Debian's etcd-server package (installed with apt-get if
#     missing; needs root);
#   - kube-apiserver, built from the k8s.io/kubernetes version pinned in
#     hack/testcluster/kube-apiserver/go.mod into a cache directory outside
#     the repository, and reused when it is already there.
#
# Usage: hack/testcluster/build.sh [--force]
#   PROXYKIT_CACHE   cache directory (default /var/cache/proxykit)
#
# A cold build takes about 7.5 minutes on 2 cores. It prints the two paths
# the tests use; internal/testcluster finds them by the same rules.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${PROXYKIT_CACHE:-/var/cache/proxykit}"
force=0
[ "${1:-}" = "--force" ] && force=1

log() { echo "hack/testcluster/build.sh: $*" >&2; }
# shellcheck source=../lib/k8sbuild.sh
. "$here/../lib/k8sbuild.sh"

# etcd ----------------------------------------------------------------------
if ! command -v etcd >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		log "etcd is missing and installing it needs root: sudo apt-get install etcd-server"
		exit 1
	fi
	log "installing etcd-server with apt-get"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
etcd_bin="$(command -v etcd)"

# kube-apiserver ------------------------------------------------------------
src="$here/kube-apiserver"
version="$(k8s_version "$src")"
out="$cache/kube-apiserver-$version"
if [ "$force" -eq 1 ] || [ ! -x "$out" ]; then
	log "building kube-apiserver $version into $out (a cold build takes ~7.5 min on 2 cores)"
	k8s_build "$src" "$version" "$out"
fi

echo "etcd=$etcd_bin"
echo "kube-apiserver=$out"
