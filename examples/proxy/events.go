package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/proxykit/proxykit/model"
)

// The events kube-proxy v1.36.3 sends, as its cmd/kube-proxy/app
// (server.go, server_linux.go) names them.
const (
	// eventController is the reporting controller of kube-proxy's
	// recorder; the reporting instance is it, "-" and os.Hostname().
	eventController = "kube-proxy"
	// eventActionStart is the action of every Node event.
	eventActionStart = "StartKubeProxy"

	reasonStarting        = "Starting"
	reasonIPVSDeprecation = "IPVSDeprecation"
	reasonFailedHealthz   = "FailedToStartProxierHealthcheck"
	reasonFailedMetrics   = "FailedToStartMetricServer"
	// reasonFailedServiceHC is the Warning on a Service whose health
	// check node port could not be opened (pkg/proxy/healthcheck), with
	// the action actionListen.
	reasonFailedServiceHC = "FailedToStartServiceHealthcheck"
	actionListen          = "Listen"
	ipvsDeprecationNote   = "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead."
)

// eventFlushTimeout bounds how long stop waits for the events recorded
// so far to reach the API server.
var eventFlushTimeout = 5 * time.Second

// eventRecorder sends the daemon's events as kube-proxy does: through
// client-go's events.k8s.io/v1 broadcaster (events.NewBroadcaster on the
// client's EventsV1), from a recorder whose reporting controller is
// "kube-proxy", about the Node referenced by kind and name only
// ({apiVersion v1, kind Node, name, namespace ""}), so that the events
// land in the "default" namespace where kube-proxy's do.
//
// Unlike kube-proxy, which never stops its broadcaster, stop waits for
// the events recorded so far to be written (bounded by eventFlushTimeout)
// before it shuts the broadcaster down: a run that fails at start (a
// server's bind with --bind-address-hard-fail) still leaves its event.
type eventRecorder struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	node        *v1.ObjectReference
	sink        *countingSink
	log         *slog.Logger

	mu       sync.Mutex
	recorded int // events handed to the recorder
	cancel   context.CancelFunc
	stopped  bool
}

// newEventRecorder returns a recorder of events about the Node nodeName,
// written with client. start must be called before the first event:
// the broadcaster drops what it gets before its sink runs.
func newEventRecorder(client kubernetes.Interface, nodeName string, log *slog.Logger) *eventRecorder {
	sink := &countingSink{EventSink: &events.EventSinkImpl{Interface: client.EventsV1()}, log: log, wrote: make(chan struct{}, 1)}
	b := events.NewBroadcaster(sink)
	return &eventRecorder{
		broadcaster: b,
		recorder:    b.NewRecorder(clientscheme.Scheme, eventController),
		node:        &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName, Namespace: ""},
		sink:        sink,
		log:         log,
	}
}

// start starts writing the recorded events to the API server, as
// kube-proxy's Run does before it starts its servers. The writes use a
// context of their own, canceled by stop, so that the events of a run
// that ends are still written.
func (r *eventRecorder) start() error {
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		cancel()
		return fmt.Errorf("could not start the event recorder: %w", err)
	}
	r.mu.Lock()
	r.cancel = cancel
	r.mu.Unlock()
	return nil
}

// event records one event about the Node. note is sent as is.
func (r *eventRecorder) event(eventType, reason, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.recorded++
	r.recorder.Eventf(r.node, nil, eventType, reason, eventActionStart, "%s", note)
}

// serviceHealthFailed records, on the Service, that its health check
// node port could not be opened, with kube-proxy's note; the engine calls
// it at each attempt (proxier.Config.ServiceHealthError).
func (r *eventRecorder) serviceHealthFailed(svc model.ServiceName, port uint16, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.recorded++
	ref := &v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: svc.Namespace, Name: svc.Name}
	r.recorder.Eventf(ref, nil, v1.EventTypeWarning, reasonFailedServiceHC, actionListen,
		"node %s failed to start healthcheck %q on port %d: %v", r.node.Name, svc.String(), port, err)
}

// starting records kube-proxy's birth cry: Normal, Starting,
// StartKubeProxy, no note. kube-proxy sends it once the informers are
// started, just before its proxier's sync loop.
func (r *eventRecorder) starting() {
	r.event(v1.EventTypeNormal, reasonStarting, "")
}

// ipvsDeprecation records the Warning kube-proxy sends in ipvs mode,
// and logs its message at error, as kube-proxy does.
func (r *eventRecorder) ipvsDeprecation() {
	r.log.Error(ipvsDeprecationNote)
	r.event(v1.EventTypeWarning, reasonIPVSDeprecation, ipvsDeprecationNote)
}

// serverFailed records the Warning kube-proxy sends when, with
// bindAddressHardFail, its healthz or metrics server fails:
// FailedToStartProxierHealthcheck or FailedToStartMetricServer, with
// kube-proxy's error text as the note.
func (r *eventRecorder) serverFailed(err *serverError) {
	reason := reasonFailedMetrics
	if err.what == serverHealthz {
		reason = reasonFailedHealthz
	}
	r.event(v1.EventTypeWarning, reason, err.kubeProxyText())
}

// stop waits, at most eventFlushTimeout, until every recorded event has
// been offered to the API server, then stops the writes and shuts the
// broadcaster down.
func (r *eventRecorder) stop() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	recorded, cancel := r.recorded, r.cancel
	r.mu.Unlock()
	if cancel != nil {
		if !r.sink.wait(recorded, eventFlushTimeout) {
			r.log.Warn("events not all written before the timeout", "recorded", recorded, "timeout", eventFlushTimeout)
		}
		cancel()
	}
	r.broadcaster.Shutdown()
}

// countingSink is an EventSink that counts the writes that returned, so
// that stop can wait for them, and logs the failed ones (client-go logs
// them with klog too).
type countingSink struct {
	events.EventSink
	log *slog.Logger

	mu      sync.Mutex
	written int
	wrote   chan struct{} // signaled after each write
}

// Create implements events.EventSink.
func (s *countingSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	out, err := s.EventSink.Create(ctx, e)
	s.done(e, err)
	return out, err
}

// Update implements events.EventSink.
func (s *countingSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	out, err := s.EventSink.Update(ctx, e)
	s.done(e, err)
	return out, err
}

// Patch implements events.EventSink.
func (s *countingSink) Patch(ctx context.Context, e *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	out, err := s.EventSink.Patch(ctx, e, data)
	s.done(e, err)
	return out, err
}

func (s *countingSink) done(e *eventsv1.Event, err error) {
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Warn("could not write event", "reason", e.Reason, "regarding", e.Regarding.Kind+"/"+e.Regarding.Name, "err", err)
	}
	s.mu.Lock()
	s.written++
	s.mu.Unlock()
	select {
	case s.wrote <- struct{}{}:
	default:
	}
}

// wait reports whether at least n writes returned within timeout.
func (s *countingSink) wait(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		written := s.written
		s.mu.Unlock()
		if written >= n {
			return true
		}
		select {
		case <-s.wrote:
		case <-deadline.C:
			return false
		}
	}
}
