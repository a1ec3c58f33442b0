package nftables

import (
	"errors"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// testSvc is a service port with its targets.
type testSvc = backendtest.Svc

// Short names for the builders the tests use most.
var (
	eps        = backendtest.Endpoints
	clusterSvc = backendtest.ClusterSvc
	request    = backendtest.Request
)

// newTestBackend returns a backend of family f in ns, closed (and its
// table deleted) at the end of the test.
func newTestBackend(tb testing.TB, ns *testNS, f model.IPFamily, cfg Config) *backend {
	tb.Helper()
	cfg.NetNS = ns.path
	b, err := NewBackend(cfg, f)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b.(*backend)
}

func mustSync(tb testing.TB, b *backend, req *proxier.SyncRequest) {
	tb.Helper()
	if err := b.Sync(tb.Context(), req); err != nil {
		tb.Fatalf("sync: %+v", err)
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
