package iptables

import (
	"slices"
	"strings"
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

// badRule makes b append the rule bad(name), when not empty, to the SVC
// chain of service port name: the kernel or iptables-restore refuses it.
// nil stops it.
func badRule(b *backend, bad func(model.ServicePortName) string) {
	if bad == nil {
		b.rewrite = nil
		return
	}
	b.rewrite = func(n model.ServicePortName, rd rendering) rendering {
		rule := bad(n)
		if rule == "" || rd[tNAT] == nil {
			return rd
		}
		tr := &tableRules{chains: slices.Clone(rd[tNAT].chains), shared: rd[tNAT].shared}
		for i, c := range tr.chains {
			if strings.Contains(c.name, "-"+kindSVC+"-") {
				tr.chains[i].rules = append(slices.Clip(c.rules), rule)
			}
		}
		rd[tNAT] = tr
		return rd
	}
}

// badVerdict makes b replace the verdict of the filter rules that reject
// or drop service port name's traffic with bad(name), when not empty.
func badVerdict(b *backend, bad func(model.ServicePortName) string) {
	b.rewrite = func(n model.ServicePortName, rd rendering) rendering {
		v := bad(n)
		if v == "" || rd[tFilter] == nil {
			return rd
		}
		tr := &tableRules{chains: rd[tFilter].chains, shared: slices.Clone(rd[tFilter].shared)}
		for i, r := range tr.shared {
			for _, old := range []string{" -j REJECT", " -j DROP"} {
				if rest, ok := strings.CutSuffix(r.rule, old); ok {
					tr.shared[i].rule = rest + " -j " + v
				}
			}
		}
		rd[tFilter] = tr
		return rd
	}
}
