package nftables

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// TestRecordedSyncFailureMetric: a sync the kernel refuses counts in
// kubeproxy_sync_proxy_rules_nftables_sync_failures_total, kube-proxy's
// counter (k8s.io/kubernetes/pkg/proxy/metrics/metrics.go, v1.36.3, lines
// 207-215: a counter labelled ip_family), with the proxier's name; a
// service port left out because the kernel refused its rules does not.
func TestRecordedSyncFailureMetric(t *testing.T) {
	const name = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	reg := prometheus.NewRegistry()
	cfg := goldenConfig(model.IPv4, DefaultTableName)
	cfg.Registerer, cfg.Name = reg, "pod-net"
	b, rec := recordedBackend(t, model.IPv4, cfg)
	failures := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			if mf.GetType() != dto.MetricType_COUNTER || len(mf.GetMetric()) != 1 {
				t.Fatalf("%s: %v with %d series, want one counter", name, mf.GetType(), len(mf.GetMetric()))
			}
			m := mf.GetMetric()[0]
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if want := []string{"ip_family=IPv4", "proxier=pod-net"}; !slices.Equal(labels, want) {
				t.Errorf("%s: labels %v, want %v", name, labels, want)
			}
			return m.GetCounter().GetValue()
		}
		t.Fatalf("no %s", name)
		return 0
	}
	state := goldenState(model.IPv4)
	if err := b.Sync(t.Context(), request(model.IPv4, state, nil)); err != nil {
		t.Fatal(err)
	}
	if n := failures(); n != 0 {
		t.Fatalf("%v failures after a sync that succeeded", n)
	}
	// A service port's rule refused: it is left out, the sync succeeds.
	rec.Reject = func(m *nftnl.Message) unix.Errno {
		if m.Type == unix.NFT_MSG_NEWRULE && m.Name == "svc-default/sticky/tcp" {
			return unix.EINVAL
		}
		return 0
	}
	if err := b.Sync(t.Context(), request(model.IPv4, state, nil)); err == nil {
		t.Fatal("no object error for the refused service port")
	}
	if n := failures(); n != 0 {
		t.Errorf("%v failures after a service port was left out, want 0", n)
	}
	// Every message refused: the sync fails.
	rec.Reject = func(*nftnl.Message) unix.Errno { return unix.EINVAL }
	if err := b.Sync(t.Context(), request(model.IPv4, state, nil)); err == nil {
		t.Fatal("a refused transaction went through")
	}
	if n := failures(); n != 1 {
		t.Errorf("%v failures after one, want 1", n)
	}
}
