package proxier

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/proxykit/proxykit/model"
)

// TestEngineConflictingOwners checks that a service port claiming an
// address and port (or node port) that another one owns is not given to
// the backend, whatever its name, until the owner lets go, and that the
// conflict is counted.
func TestEngineConflictingOwners(t *testing.T) {
	r := newRecorder(model.IPv4)
	e, _ := newTestEngine(t, Config{MinSyncInterval: 5 * time.Millisecond, SyncPeriod: time.Hour}, r)
	flush := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	programmed := func() map[string]bool {
		reqs := r.requests()
		out := map[string]bool{}
		for n := range reqs[len(reqs)-1].targets {
			out[n.Name] = true
		}
		return out
	}
	conflicts := func() int {
		var m dto.Metric
		if err := e.metrics.conflicts.WithLabelValues("IPv4").Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetGauge().GetValue())
	}
	owner := testService("owner", "10.96.0.1", 80)
	e.OnServiceAdd(owner)
	e.OnServiceSynced()
	e.OnEndpointSlicesSynced()
	flush()

	// A newcomer whose external IP is the owner's cluster IP, and whose
	// name sorts first: it is rejected, the owner keeps its address.
	hijack := testService("a-hijack", "10.96.0.2", 80)
	hijack.Spec.ExternalIPs = []string{"10.96.0.1"}
	e.OnServiceAdd(hijack)
	flush()
	if got := programmed(); !got["owner"] || got["a-hijack"] || conflicts() != 1 {
		t.Fatalf("after the hijack: programmed %v, conflicts %d; want only the owner, 1 conflict", got, conflicts())
	}
	// A newcomer with the owner's node port, too.
	owner2 := owner.DeepCopy()
	owner2.Spec.Type = "NodePort"
	owner2.Spec.Ports[0].NodePort = 30080
	e.OnServiceUpdate(owner, owner2)
	np := testService("b-nodeport", "10.96.0.3", 80)
	np.Spec.Type = "NodePort"
	np.Spec.Ports[0].NodePort = 30080
	e.OnServiceAdd(np)
	flush()
	if got := programmed(); !got["owner"] || got["b-nodeport"] || conflicts() != 2 {
		t.Fatalf("after the node port clash: programmed %v, conflicts %d", got, conflicts())
	}
	// A full resync changes nothing of it.
	if ok, _ := e.syncOnce(context.Background(), true); !ok {
		t.Fatal("periodic sync failed")
	}
	if got := programmed(); !got["owner"] || got["a-hijack"] || got["b-nodeport"] {
		t.Fatalf("after a full resync: programmed %v", got)
	}
	// The owner goes: the newcomers get their turn, and are programmed.
	e.OnServiceDelete(owner2)
	flush()
	reqs := r.requests()
	last := reqs[len(reqs)-1]
	if got := programmed(); got["owner"] || !got["a-hijack"] || !got["b-nodeport"] || conflicts() != 0 {
		t.Fatalf("after the owner left: programmed %v, conflicts %d", got, conflicts())
	}
	for _, want := range []string{"ns/a-hijack:p/TCP", "ns/b-nodeport:p/TCP"} {
		found := false
		for _, c := range last.changed {
			found = found || c == want
		}
		if !found {
			t.Errorf("%s not in the changed service ports %v", want, last.changed)
		}
	}
}
