package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// nodeTracker wraps a Proxier and keeps the last Node object it was
// given, as kube-proxy's NodeManager does for /healthz: a Node never seen
// makes the node ineligible; a deleted one stays as last seen (kube-proxy
// only logs the deletion). In NodeCIDR mode a change of the Node's pod
// CIDRs is fatal, as in kube-proxy.
type nodeTracker struct {
	proxier.Proxier
	log *slog.Logger
	// podCIDRs, when set, are the pod CIDRs the proxier was configured
	// with; a Node with others calls fatal.
	podCIDRs []string
	fatal    func(error)

	mu   sync.Mutex
	node *v1.Node
}

func (t *nodeTracker) set(n *v1.Node) {
	t.mu.Lock()
	t.node = n
	t.mu.Unlock()
	if t.podCIDRs != nil && n != nil && !equalStrings(n.Spec.PodCIDRs, t.podCIDRs) {
		t.log.Error("PodCIDRs changed for the node", "node", n.Name, "newPodCIDRs", n.Spec.PodCIDRs, "oldPodCIDRs", t.podCIDRs)
		t.fatal(fmt.Errorf("the pod CIDRs of node %s changed from %v to %v (detectLocalMode NodeCIDR)", n.Name, t.podCIDRs, n.Spec.PodCIDRs))
	}
}

// OnNodeAdd implements proxier.NodeHandler.
func (t *nodeTracker) OnNodeAdd(n *v1.Node) {
	t.set(n)
	t.Proxier.OnNodeAdd(n)
}

// OnNodeUpdate implements proxier.NodeHandler.
func (t *nodeTracker) OnNodeUpdate(old, n *v1.Node) {
	t.set(n)
	t.Proxier.OnNodeUpdate(old, n)
}

// OnNodeDelete implements proxier.NodeHandler.
func (t *nodeTracker) OnNodeDelete(n *v1.Node) {
	t.log.Error("Current Node is being deleted", "node", n.Name)
	t.Proxier.OnNodeDelete(n)
}

// eligible reports kube-proxy's NodeEligible: the Node exists, is not
// being deleted and has no ToBeDeletedByClusterAutoscaler taint.
func (t *nodeTracker) eligible() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.node == nil || t.node.DeletionTimestamp != nil {
		return false
	}
	for _, taint := range t.node.Spec.Taints {
		if taint.Key == proxier.TaintToBeDeletedByClusterAutoscaler {
			return false
		}
	}
	return true
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// proxierHealth is one family's entry of kube-proxy's /healthz body.
type proxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// proxyHealth is kube-proxy's /healthz and /livez body
// (pkg/proxy/healthcheck.ProxyHealth), fields in its order.
type proxyHealth struct {
	LastUpdated  time.Time                `json:"lastUpdated"`
	CurrentTime  time.Time                `json:"currentTime"`
	NodeEligible *bool                    `json:"nodeEligible,omitempty"`
	Healthy      bool                     `json:"healthy"`
	Status       map[string]proxierHealth `json:"status,omitempty"`
}

// healthzHandler serves kube-proxy's healthz server: /healthz (the
// proxier programs its events within timeout, and the node is eligible)
// and /livez (the first only), with kube-proxy's JSON body, status code
// (200 or 503) and headers. The engine's health stands for every family
// it programs (it syncs them together). Answers are counted in the
// engine's kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total
// when it counts them (proxier.HealthAnswerCounter).
func healthzHandler(p proxier.Proxier, nodes *nodeTracker, families []model.IPFamily, timeout time.Duration) http.Handler {
	hr, _ := p.(proxier.HealthReporter)
	counter, _ := p.(proxier.HealthAnswerCounter)
	health := func(now time.Time) proxyHealth {
		ph := proxyHealth{CurrentTime: now, Healthy: true, Status: map[string]proxierHealth{}}
		if hr == nil {
			return ph
		}
		h := hr.Health()
		ph.LastUpdated = h.LastSync
		ph.Healthy = h.OldestPending.IsZero() || now.Sub(h.OldestPending) < timeout
		for _, f := range families {
			ph.Status[familyName(f)] = proxierHealth{LastUpdated: h.LastSync, Healthy: ph.Healthy}
		}
		return ph
	}
	answer := func(w http.ResponseWriter, path string, ph proxyHealth, ok bool) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		code := http.StatusServiceUnavailable
		if ok {
			code = http.StatusOK
			// As kube-proxy: a healthy answer's lastUpdated is now.
			ph.LastUpdated = ph.CurrentTime
		}
		if counter != nil {
			counter.CountHealthAnswer(path, code)
		}
		w.WriteHeader(code)
		b, _ := json.Marshal(ph)
		_, _ = w.Write(b)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		ph := health(time.Now())
		eligible := nodes.eligible()
		ph.NodeEligible = &eligible
		answer(w, "/healthz", ph, ph.Healthy && eligible)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		ph := health(time.Now())
		answer(w, "/livez", ph, ph.Healthy)
	})
	return mux
}

// familyName is the IP family as kube-proxy's status map names it.
func familyName(f model.IPFamily) string {
	if f == model.IPv6 {
		return string(v1.IPv6Protocol)
	}
	return string(v1.IPv4Protocol)
}

// metricsHandler serves kube-proxy's metrics server: /metrics, /healthz
// and /healthz/ping (the API server's healthz with the ping check only:
// always "ok"), /proxyMode, /configz, with profiling /debug/pprof/ and
// /debug/flags/v (PUT a verbosity), and proxykit's /debug/services
// (services, when not nil).
func metricsHandler(reg *prometheus.Registry, mode string, configz []byte, profiling bool, level *slog.LevelVar, services http.Handler) http.Handler {
	mux := http.NewServeMux()
	if services != nil {
		mux.Handle("/debug/services", services)
	}
	plain := func(w http.ResponseWriter, code int, body string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
	healthz := func(w http.ResponseWriter, r *http.Request) {
		if _, verbose := r.URL.Query()["verbose"]; verbose {
			plain(w, http.StatusOK, "[+]ping ok\nhealthz check passed\n")
			return
		}
		plain(w, http.StatusOK, "ok")
	}
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/healthz/ping", func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, "ok") })
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, mode) })
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/configz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(configz)
	})
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/debug/pprof/", http.StatusMovedPermanently)
		})
		index := func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, "<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n")
		}
		mux.HandleFunc("/debug/flags", index)
		mux.HandleFunc("/debug/flags/", index)
		mux.HandleFunc("/debug/flags/v", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPut {
				plain(w, http.StatusNotAcceptable, "unsupported http method")
				return
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				plain(w, http.StatusBadRequest, "error reading request body: "+err.Error())
				return
			}
			v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 31)
			if err != nil {
				plain(w, http.StatusBadRequest, fmt.Sprintf("invalid verbosity %q: %v", strings.TrimSpace(string(b)), err))
				return
			}
			level.Set(slog.Level(-int(v)))
			plain(w, http.StatusOK, fmt.Sprintf("successfully set verbosity to %d", v))
		})
	}
	return mux
}

// The servers' names, in logs and errors.
const (
	serverHealthz = "healthz"
	serverMetrics = "metrics"
)

// server is one of the daemon's HTTP servers.
type server struct {
	what, addr string
	handler    http.Handler
	hardFail   bool
	log        *slog.Logger
	// failed, when not nil, is called with hardFail when the server,
	// once listening, stops serving with an error: kube-proxy then
	// sends its event and exits.
	failed func(*serverError)

	mu     sync.Mutex
	srv    *http.Server
	closed bool
}

// serverError is the failure of one of the daemon's servers: it could
// not listen on its address, or (serving) Serve failed.
type serverError struct {
	what, addr string
	serving    bool
	err        error
}

func (e *serverError) Error() string {
	if e.serving {
		return fmt.Sprintf("%s server on %s failed: %v", e.what, e.addr, e.err)
	}
	return fmt.Sprintf("failed to start %s server on %s: %v", e.what, e.addr, e.err)
}

func (e *serverError) Unwrap() error { return e.err }

// kubeProxyText is the error as kube-proxy words it in the note of its
// event: its healthz server wraps the listen or serve error
// (pkg/proxy/healthcheck.ProxyHealthServer.Run, then serveHealthz); its
// metrics server's is the bare error of the listen or of Serve.
func (e *serverError) kubeProxyText() string {
	if e.what != serverHealthz {
		return e.err.Error()
	}
	if e.serving {
		return fmt.Sprintf("healthz server failed: proxy healthz closed with error: %v", e.err)
	}
	return fmt.Sprintf("healthz server failed: failed to start proxy healthz on %s: %v", e.addr, e.err)
}

// retryListen is how long a server whose address cannot be bound waits
// before it tries again (kube-proxy's 5 s), unless bindAddressHardFail.
var retryListen = 5 * time.Second

// start listens and serves in the background. When the address cannot
// be bound, it fails with a *serverError if hardFail (kube-proxy's
// bindAddressHardFail), else logs and retries every 5 s until ctx is
// done, as kube-proxy does. It returns the address listened on, nil while
// retrying.
func (s *server) start(ctx context.Context) (net.Addr, error) {
	l, err := net.Listen("tcp", listenAddr(s.addr))
	if err != nil {
		if s.hardFail {
			return nil, &serverError{what: s.what, addr: s.addr, err: err}
		}
		s.log.Error("Failed to start server, will retry", "server", s.what, "address", s.addr, "err", err, "retry", retryListen)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(retryListen):
				}
				if l, err := net.Listen("tcp", listenAddr(s.addr)); err == nil {
					s.serve(l)
					return
				}
			}
		}()
		return nil, nil
	}
	s.serve(l)
	return l.Addr(), nil
}

func (s *server) serve(l net.Listener) {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = l.Close()
		return
	}
	s.srv = srv
	s.mu.Unlock()
	s.log.Info("serving", "server", s.what, "address", l.Addr().String())
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("HTTP server failed", "server", s.what, "err", err)
			if s.hardFail && s.failed != nil {
				s.failed(&serverError{what: s.what, addr: s.addr, serving: true, err: err})
			}
		}
	}()
}

// shutdown stops the server, if it serves.
func (s *server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv := s.srv
	s.closed = true
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}
