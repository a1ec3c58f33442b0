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
version="$(awk '($1 == "k8s.io/kubernetes" && $2 ~ /^v/) { print $2 } ($1 == "require" && $2 == "k8s.io/kubernetes") { print $3 }' "$src/go.mod" | head -n1)"
if [ -z "$version" ]; then
	log "no 'require k8s.io/kubernetes vX.Y.Z' line in $src/go.mod"
	exit 1
fi
out="$cache/kube-apiserver-$version"
if [ "$force" -eq 1 ] || [ ! -x "$out" ]; then
	mkdir -p "$cache"
	minor="${version#v1.}"
	minor="${minor%%.*}"
	log "building kube-apiserver $version into $out (a cold build takes ~7.5 min on 2 cores)"
	start=$(date +%s)
	tmp="$out.tmp.$$"
	trap 'rm -f "$tmp"' EXIT
	(
		cd "$src"
		# The module is outside the main module's tree walk (own go.mod);
		# GOWORK=off keeps any go.work from pulling it in.
		GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 go build -trimpath \
			-ldflags "-s -w \
				-X k8s.io/component-base/version.gitVersion=$version \
				-X k8s.io/component-base/version.gitMajor=1 \
				-X k8s.io/component-base/version.gitMinor=$minor \
				-X k8s.io/component-base/version.gitTreeState=clean" \
			-o "$tmp" .
	)
	mv -f "$tmp" "$out"
	trap - EXIT
	log "built in $(($(date +%s) - start)) s"
fi

echo "etcd=$etcd_bin"
echo "kube-apiserver=$out"
