# Shared by hack/testcluster/build.sh and hack/kubeproxy/build.sh: build a
# program of a module of its own that pins k8s.io/kubernetes, as the
# upstream release would be built. Source it; it defines two functions and
# expects a log function.

# k8s_version SRC prints the k8s.io/kubernetes version SRC/go.mod requires,
# or fails.
k8s_version() {
	local v
	v="$(awk '($1 == "k8s.io/kubernetes" && $2 ~ /^v/) { print $2 } ($1 == "require" && $2 == "k8s.io/kubernetes") { print $3 }' "$1/go.mod" | head -n1)"
	if [ -z "$v" ]; then
		log "no 'require k8s.io/kubernetes vX.Y.Z' line in $1/go.mod"
		return 1
	fi
	echo "$v"
}

# k8s_build SRC VERSION OUT builds the main package in SRC into OUT (through
# a temporary file, so OUT is whole or absent), stamped with VERSION the
# way upstream stamps its binaries.
k8s_build() {
	local src="$1" version="$2" out="$3" minor start tmp
	mkdir -p "$(dirname "$out")"
	minor="${version#v1.}"
	minor="${minor%%.*}"
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
}
