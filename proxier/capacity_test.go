package proxier

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
)

// TestEngineOverCapacityGauge: proxykit_service_port_over_capacity counts
// the service ports the backend left out because its dataplane is too
// small (object errors matching ErrCapacity), not those left out for
// another reason, and follows them as they are changed, deleted and
// resynced.
func TestEngineOverCapacityGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 5 * time.Millisecond, SyncPeriod: time.Hour, Registerer: reg}, r)
	port := func(name string) model.ServicePortName {
		return model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: name}, Port: "p", Protocol: model.TCP}
	}
	full := func(name string) error {
		// As the eBPF backend reports a full map: wrapped, matching
		// ErrCapacity with Is.
		return &ObjectError{Service: port(name), Err: fmt.Errorf("update map: %w", ErrCapacity)}
	}
	fail := func(errs ...error) {
		r.mu.Lock()
		r.objErr = errors.Join(errs...)
		r.mu.Unlock()
	}
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "ip_family" && l.GetValue() == "IPv4" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatalf("no %s{ip_family=IPv4} in the registry", name)
		return 0
	}
	check := func(what string, want float64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := gauge("proxykit_service_port_over_capacity"); got != want {
			t.Errorf("%s: proxykit_service_port_over_capacity %v, want %v", what, got, want)
		}
		if got := gauge("proxykit_service_port_conflicts"); got != 0 {
			t.Errorf("%s: proxykit_service_port_conflicts %v, want 0 (no conflict)", what, got)
		}
	}

	a, b := testService("a", "10.96.0.1", 80), testService("b", "10.96.0.2", 80)
	e.OnServiceAdd(a)
	e.OnServiceAdd(b)
	e.OnServiceAdd(testService("c", "10.96.0.3", 80))
	// Before the sources are synced: the first sync may start at once.
	fail(full("a"), full("b"), &ObjectError{Service: port("c"), Err: errors.New("bad")})
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	check("a and b do not fit, c is bad", 2)

	// a changes and now fits; b, unchanged, is still out.
	fail()
	a2 := a.DeepCopy()
	a2.Spec.Ports[0].Port = 81
	e.OnServiceUpdate(a, a2)
	check("a fits after its change", 1)

	// b changes and still does not fit: counted once.
	fail(full("b"))
	b2 := b.DeepCopy()
	b2.Spec.Ports[0].Port = 81
	e.OnServiceUpdate(b, b2)
	check("b changed, still too big", 1)

	// b goes.
	fail()
	e.OnServiceDelete(b2)
	check("b deleted", 0)

	// A full resync starts over from what the backend says.
	fail(full("a"))
	if ok, _ := e.syncOnce(context.Background(), true); !ok {
		t.Fatal("periodic sync failed")
	}
	if got := gauge("proxykit_service_port_over_capacity"); got != 1 {
		t.Errorf("full resync with a too big: proxykit_service_port_over_capacity %v, want 1", got)
	}
	fail()
	if ok, _ := e.syncOnce(context.Background(), true); !ok {
		t.Fatal("periodic sync failed")
	}
	if got := gauge("proxykit_service_port_over_capacity"); got != 0 {
		t.Errorf("full resync with everything fitting: proxykit_service_port_over_capacity %v, want 0", got)
	}
}
