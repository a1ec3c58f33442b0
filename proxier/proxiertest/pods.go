package proxiertest

import (
	"sync"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// podNamespaces maps a running case to its node1 pods' namespace paths.
var podNamespaces sync.Map // testing.TB -> []string

func registerPods(t testing.TB, tn *testnet.Topology) {
	var paths []string
	for _, p := range tn.Node1.Pods {
		paths = append(paths, p.Path())
	}
	podNamespaces.Store(t, paths)
	t.Cleanup(func() { podNamespaces.Delete(t) })
}

// PodNamespaces returns the network namespace paths of the pods behind the
// node the proxier under test runs on, for the case running under t (the
// t a Factory receives). A backend that must be told its pods' namespaces
// (a socket-level load balancer, say) reads them here. It returns nil for
// a t the suite did not create.
func PodNamespaces(t testing.TB) []string {
	v, ok := podNamespaces.Load(t)
	if !ok {
		return nil
	}
	return append([]string(nil), v.([]string)...)
}
