package iptables

import (
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
)

// testSvc is a service port with its targets.
type testSvc = backendtest.Svc

// Short names for the builders the tests use most.
var (
	eps        = backendtest.Endpoints
	clusterSvc = backendtest.ClusterSvc
	request    = backendtest.Request
)

// testRenderer returns a renderer of family f with the default prefix and
// cfg's options.
func testRenderer(t testing.TB, f model.IPFamily, cfg Config) *renderer {
	t.Helper()
	cfg = cfg.WithDefaults()
	n, err := newNames(cfg.ChainPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return newRenderer(cfg, f, n, true)
}

// offlineBackend is a backend that renders but runs nothing: enough for
// building restore inputs.
func offlineBackend(t testing.TB, f model.IPFamily, cfg Config) *backend {
	return &backend{cfg: cfg.WithDefaults(), fam: f, r: testRenderer(t, f, cfg), st: newState()}
}
