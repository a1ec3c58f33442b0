package testcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// KubernetesVersion is the kube-apiserver version hack/testcluster/build.sh
// builds: the k8s.io/kubernetes version pinned in
// hack/testcluster/kube-apiserver/go.mod (a test checks they agree).
const KubernetesVersion = "v1.36.3"

// BuildScript provides the binaries, relative to the repository root.
const BuildScript = "hack/testcluster/build.sh"

// Environment variables that locate the binaries.
const (
	// EnvCache is the cache directory the build script writes to;
	// default DefaultCache.
	EnvCache = "PROXYKIT_CACHE"
	// EnvKubeAPIServer names a kube-apiserver binary to use instead of
	// the one in the cache.
	EnvKubeAPIServer = "PROXYKIT_KUBE_APISERVER"
	// EnvEtcd names an etcd binary to use instead of the one in PATH.
	EnvEtcd = "PROXYKIT_ETCD"
)

// DefaultCache is where the build script puts kube-apiserver.
const DefaultCache = "/var/cache/proxykit"

// ErrNoBinaries is matched by the error of [FindBinaries] when etcd or
// kube-apiserver is missing.
var ErrNoBinaries = errors.New("control plane binaries missing")

// Binaries are the programs of the control plane.
type Binaries struct {
	Etcd, KubeAPIServer string
}

// FindBinaries locates etcd ($PROXYKIT_ETCD, else etcd in PATH) and
// kube-apiserver ($PROXYKIT_KUBE_APISERVER, else
// kube-apiserver-<KubernetesVersion> in $PROXYKIT_CACHE, default
// /var/cache/proxykit). A missing one is an error matching
// [ErrNoBinaries].
func FindBinaries() (Binaries, error) {
	var b Binaries
	var errs []error
	if p := os.Getenv(EnvEtcd); p != "" {
		b.Etcd = p
	} else if p, err := exec.LookPath("etcd"); err == nil {
		b.Etcd = p
	} else {
		errs = append(errs, fmt.Errorf("no etcd in PATH"))
	}
	if p := os.Getenv(EnvKubeAPIServer); p != "" {
		b.KubeAPIServer = p
	} else {
		cache := os.Getenv(EnvCache)
		if cache == "" {
			cache = DefaultCache
		}
		b.KubeAPIServer = filepath.Join(cache, "kube-apiserver-"+KubernetesVersion)
	}
	for _, p := range []string{b.Etcd, b.KubeAPIServer} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err != nil {
			errs = append(errs, err)
		} else if fi.IsDir() || fi.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s is not an executable file", p))
		}
	}
	if len(errs) > 0 {
		return b, fmt.Errorf("%w: %w", ErrNoBinaries, errors.Join(errs...))
	}
	return b, nil
}

// RequireBinaries returns the binaries, or skips the test with a message
// naming the build script (fails it when CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1).
func RequireBinaries(tb testing.TB) Binaries {
	tb.Helper()
	b, err := FindBinaries()
	if err != nil {
		msg := fmt.Sprintf("requires etcd and kube-apiserver %s: %v; run %s (apt-get installs etcd-server, ~7.5 min cold build of kube-apiserver into $%s, default %s)",
			KubernetesVersion, err, BuildScript, EnvCache, DefaultCache)
		if testnet.Mandatory() {
			tb.Fatalf("%s (a failure, not a skip, because %s=true or %s=1)", msg, testnet.EnvCI, testnet.EnvRequirePrivileged)
		}
		tb.Skipf("%s (set %s=1 to make this a failure)", msg, testnet.EnvRequirePrivileged)
	}
	return b
}
