package kubeproxy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// KubernetesVersion is the kube-proxy version hack/kubeproxy/build.sh
// builds the oracle from: the k8s.io/kubernetes version pinned in
// hack/kubeproxy/oracle/go.mod (a test checks they agree).
const KubernetesVersion = "v1.36.3"

// BuildScript builds the oracle, relative to the repository root.
const BuildScript = "hack/kubeproxy/build.sh"

// Environment variables that locate the oracle.
const (
	// EnvCache is the cache directory the build script writes to;
	// default DefaultCache. internal/testcluster reads it too.
	EnvCache = "PROXYKIT_CACHE"
	// EnvBinary names an oracle binary to use instead of the one in the
	// cache.
	EnvBinary = "PROXYKIT_KUBE_PROXY_ORACLE"
)

// DefaultCache is where the build script puts the oracle.
const DefaultCache = "/var/cache/proxykit"

// ErrNoBinary is matched by the error of [Binary] when the oracle is
// missing.
var ErrNoBinary = errors.New("kube-proxy oracle binary missing")

// Binary locates the oracle: $PROXYKIT_KUBE_PROXY_ORACLE, else
// kube-proxy-oracle-<KubernetesVersion>-<digest> in $PROXYKIT_CACHE
// (default /var/cache/proxykit), where digest names the oracle's sources
// in this checkout (see [SourceDigest]). It does not build it; a missing
// or non-executable file is an error matching [ErrNoBinary], and the path
// is returned anyway.
func Binary() (string, error) {
	p := os.Getenv(EnvBinary)
	if p == "" {
		cache := os.Getenv(EnvCache)
		if cache == "" {
			cache = DefaultCache
		}
		digest, err := SourceDigest()
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrNoBinary, err)
		}
		p = filepath.Join(cache, "kube-proxy-oracle-"+KubernetesVersion+"-"+digest)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrNoBinary, err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return p, fmt.Errorf("%w: %s is not an executable file", ErrNoBinary, p)
	}
	return p, nil
}

// RequireBinary returns the oracle's path, or skips the test with a message
// naming the build script (fails it when CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1).
func RequireBinary(tb testing.TB) string {
	tb.Helper()
	p, err := Binary()
	if err != nil {
		msg := fmt.Sprintf("requires the kube-proxy %s oracle: %v; run %s (builds it into $%s, default %s)",
			KubernetesVersion, err, BuildScript, EnvCache, DefaultCache)
		if testnet.Mandatory() {
			tb.Fatalf("%s (a failure, not a skip, because %s=true or %s=1)", msg, testnet.EnvCI, testnet.EnvRequirePrivileged)
		}
		tb.Skipf("%s (set %s=1 to make this a failure)", msg, testnet.EnvRequirePrivileged)
	}
	return p
}

// SourceDigest returns the digest the build script puts in the binary's
// name: the first 12 hex digits of the SHA-256 of go.mod, go.sum and the
// .go files of hack/kubeproxy/oracle, in byte order of their names, each
// as its name, a newline and its content.
func SourceDigest() (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the oracle's sources")
	}
	dir := filepath.Join(filepath.Dir(self), "..", "..", "hack", "kubeproxy", "oracle")
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", err
	}
	names = append(names, filepath.Join(dir, "go.mod"), filepath.Join(dir, "go.sum"))
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", fmt.Errorf("oracle sources: %w", err)
		}
		h.Write([]byte(n + "\n"))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
