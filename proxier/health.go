package proxier

import (
	"encoding/json"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TaintToBeDeletedByClusterAutoscaler marks a node the cluster autoscaler
// is about to delete; load balancers should stop sending to it.
const TaintToBeDeletedByClusterAutoscaler = "ToBeDeletedByClusterAutoscaler"

// Health is a snapshot of the engine's state for health checks.
type Health struct {
	// LastSync is when the last successful sync finished (zero before
	// the first).
	LastSync time.Time
	// OldestPending is when the oldest event not yet programmed arrived;
	// zero when everything is programmed.
	OldestPending time.Time
	// LastLoop is when the sync loop last ran (a sync attempt, or a wake
	// up while waiting for the initial lists).
	LastLoop time.Time
	// NodeTerminating is set when this proxier's Node is being deleted or
	// carries the ToBeDeletedByClusterAutoscaler taint.
	NodeTerminating bool
	// Running is set while Run runs.
	Running bool
}

// Healthy reports whether no event has waited longer than timeout to be
// programmed and the node is not terminating, as of now.
func (h Health) Healthy(now time.Time, timeout time.Duration) bool {
	if h.NodeTerminating {
		return false
	}
	return h.OldestPending.IsZero() || now.Sub(h.OldestPending) <= timeout
}

// Live reports whether the sync loop runs and has run within timeout (or
// has programmed everything, when it has nothing to do).
func (h Health) Live(now time.Time, timeout time.Duration) bool {
	if !h.Running {
		return false
	}
	return h.OldestPending.IsZero() || now.Sub(h.LastLoop) <= timeout
}

// HealthReporter is implemented by proxiers that report their health, as
// the engine does.
type HealthReporter interface {
	// Health returns the proxier's health as of now.
	Health() Health
}

// HealthAnswerCounter is implemented by health sources that count the
// answers [HealthHandler] gives, as the Engine does in
// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total (label
// code), kube-proxy's counters of its healthz server. A source that wraps
// an Engine forwards the count to it.
type HealthAnswerCounter interface {
	// CountHealthAnswer records that HealthHandler answered path
	// ("/healthz" or "/livez") with the HTTP status code.
	CountHealthAnswer(path string, code int)
}

// Health returns the engine's health snapshot.
func (e *Engine) Health() Health {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.health
}

func nodeTerminating(node *v1.Node) bool {
	if node.DeletionTimestamp != nil {
		return true
	}
	for _, t := range node.Spec.Taints {
		if t.Key == TaintToBeDeletedByClusterAutoscaler {
			return true
		}
	}
	return false
}

// DefaultHealthTimeout is how long an event may wait to be programmed
// before /healthz fails; kube-proxy uses twice its sync period.
const DefaultHealthTimeout = 60 * time.Second

// HealthHandler serves /healthz (src keeps up with its events and its node
// is not going away: load balancers may send traffic here) and /livez (the
// sync loop is alive) with kube-proxy's JSON body. When src is a
// [HealthAnswerCounter] (an Engine is), each answer is counted there by
// path and status code. A zero timeout means [DefaultHealthTimeout].
func HealthHandler(src HealthReporter, timeout time.Duration) http.Handler {
	if timeout <= 0 {
		timeout = DefaultHealthTimeout
	}
	counter, _ := src.(HealthAnswerCounter)
	mux := http.NewServeMux()
	serve := func(path string, check func(Health, time.Time) bool) {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			h, now := src.Health(), time.Now()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			code := http.StatusServiceUnavailable
			if check(h, now) {
				code = http.StatusOK
			}
			if counter != nil {
				counter.CountHealthAnswer(path, code)
			}
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(healthStatus{
				LastUpdated: h.LastSync, CurrentTime: now,
				NodeEligible: !h.NodeTerminating, Pending: !h.OldestPending.IsZero(),
			})
		})
	}
	serve("/healthz", func(h Health, now time.Time) bool { return h.Healthy(now, timeout) })
	serve("/livez", func(h Health, now time.Time) bool { return h.Live(now, timeout) })
	return mux
}

type healthStatus struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible bool      `json:"nodeEligible"`
	Pending      bool      `json:"pending"`
}
