package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestKernelRuleMetrics: kubeproxy_sync_proxy_rules_iptables_total
// follows what the kernel holds in our chains (counted with
// iptables-save) through a full and a partial sync,
// kubeproxy_sync_proxy_rules_iptables_last what a sync wrote, and a
// partial sync the kernel refuses as a whole counts as a restore failure
// and a partial restore failure. The families have kube-proxy's names,
// types and labels.
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
	full := gauges()
	if full["kubeproxy_sync_proxy_rules_iptables_last/nat"] == 0 || full["kubeproxy_sync_proxy_rules_iptables_last/filter"] == 0 {
		t.Errorf("a complete rewrite wrote no rules: %v", full)
	}
	api := e.svc(model.IPv4, "api", "10.96.6.3", p21)
	mustSync(t, b, request(model.IPv4, []testSvc{web, api}, backendtest.Names(empty, api)))
	check("partial sync")
	g := gauges()
	// The new service port's rules only: its chains' rules and its
	// cluster IP's dispatch rule.
	if n := g["kubeproxy_sync_proxy_rules_iptables_last/nat"]; n == 0 || n >= full["kubeproxy_sync_proxy_rules_iptables_last/nat"] {
		t.Errorf("a partial sync of one service port wrote %v nat rules; the complete rewrite wrote %v", n, full["kubeproxy_sync_proxy_rules_iptables_last/nat"])
	}
	if n := g["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"]; n != 0 {
		t.Fatalf("%v restore failures before any", n)
	}
	checkKubeProxyFamilies(t, reg)
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
	if n := gauges()["kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"]; n != 1 {
		t.Errorf("%v partial restore failures after one, want 1", n)
	}
	badRule(b, nil)
	mustSync(t, b, request(model.IPv4, []testSvc{web, api2}, nil))
	check("after the failure")
}

// checkKubeProxyFamilies checks the backend's metric families against
// kube-proxy's definitions (k8s.io/kubernetes/pkg/proxy/metrics/metrics.go,
// v1.36.3, lines 159-203): name, type and labels.
func checkKubeProxyFamilies(t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         {dto.MetricType_COUNTER, []string{"ip_family"}},
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": {dto.MetricType_COUNTER, []string{"ip_family"}},
		"kubeproxy_sync_proxy_rules_iptables_total":                          {dto.MetricType_GAUGE, []string{"ip_family", "table"}},
		"kubeproxy_sync_proxy_rules_iptables_last":                           {dto.MetricType_GAUGE, []string{"ip_family", "table"}},
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		w, ok := want[mf.GetName()]
		if !ok {
			t.Errorf("unexpected metric %s", mf.GetName())
			continue
		}
		seen[mf.GetName()] = true
		if mf.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", mf.GetName(), mf.GetType(), w.typ)
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
				if l.GetName() == "ip_family" && l.GetValue() != "IPv4" {
					t.Errorf("%s: ip_family %q, want IPv4", mf.GetName(), l.GetValue())
				}
			}
			slices.Sort(labels)
			if !slices.Equal(labels, w.labels) {
				t.Errorf("%s: labels %v, want %v", mf.GetName(), labels, w.labels)
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no %s", name)
		}
	}
}
