package iptables

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestKernelRuleMetrics: kubeproxy_sync_proxy_rules_iptables_total
// follows what the kernel holds in our chains (counted with
// iptables-save) through a full and a partial sync, and a sync the
// kernel refuses as a whole counts as a restore failure.
func TestKernelRuleMetrics(t *testing.T) {
	e := newKernelEnv(t)
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	reg := prometheus.NewRegistry()
	b := e.backend(model.IPv4, Config{Mode: ModeNFT, RewriteInterval: -1})
	var err error
	if b.metrics, err = newRuleMetrics(proxier.Config{Registerer: reg}, model.IPv4); err != nil {
		t.Fatal(err)
	}
	gauges := func() map[string]float64 { return backendtest.Metrics(t, reg, "table") }
	check := func(what string) {
		t.Helper()
		g := gauges()
		for _, table := range []string{"nat", "filter"} {
			want := strings.Count(e.exec("iptables-nft-save", "-t", table), "\n-A PROXYKIT-")
			if got := g["kubeproxy_sync_proxy_rules_iptables_total/"+table]; got != float64(want) || want == 0 {
				t.Errorf("%s: %s rules %v, the kernel holds %d in our chains", what, table, got, want)
			}
		}
	}
	web := e.svc(model.IPv4, "web", "10.96.6.1", p11, p21)
	web.Port.NodePort = 30081
	empty := e.svc(model.IPv4, "empty", "10.96.6.2")
	mustSync(t, b, request(model.IPv4, []testSvc{web, empty}, nil))
	check("first sync")
	api := e.svc(model.IPv4, "api", "10.96.6.3", p21)
	mustSync(t, b, request(model.IPv4, []testSvc{web, api}, backendtest.Names(empty, api)))
	check("partial sync")
	if n := gauges()["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"]; n != 0 {
		t.Fatalf("%v restore failures before any", n)
	}
	// iptables-nft refuses a jump to a chain that does not exist at the
	// table's COMMIT: the whole sync fails.
	badRule(b, func(n model.ServicePortName) string {
		if n == api.Port.Name {
			return "-j PKBOGUS"
		}
		return ""
	})
	api2 := e.svc(model.IPv4, "api", "10.96.6.3", p11)
	if err := b.Sync(t.Context(), request(model.IPv4, []testSvc{web, api2}, backendtest.Names(api2))); err == nil {
		t.Fatal("sync with a jump to a missing chain went through")
	}
	if n := gauges()["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"]; n != 1 {
		t.Errorf("%v restore failures after one, want 1", n)
	}
	badRule(b, nil)
	mustSync(t, b, request(model.IPv4, []testSvc{web, api2}, nil))
	check("after the failure")
}
