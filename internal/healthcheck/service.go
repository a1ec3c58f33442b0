package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// ServiceHealth is what a service's health check reports.
type ServiceHealth struct {
	// Port is the service's healthCheckNodePort.
	Port uint16
	// LocalEndpoints is the number of ready endpoints on this node.
	LocalEndpoints int
}

// ServiceServers runs the health check servers of Services. Create it with
// [NewServiceServers]; its methods are safe for concurrent use.
type ServiceServers struct {
	ns      *netns.NS
	addrs   []netip.Addr // empty: all addresses
	log     *slog.Logger
	healthy func() bool

	mu       sync.Mutex
	services map[model.ServiceName]*serviceServer
}

type serviceServer struct {
	port      uint16
	listeners []net.Listener
	srv       *http.Server

	mu     sync.Mutex
	local  int
	closed bool
}

// NewServiceServers returns servers that listen inside ns (nil: the
// caller's namespace) on addrs (empty: every address), reporting unhealthy
// whenever healthy returns false (nil: always healthy). log may be nil.
func NewServiceServers(ns *netns.NS, addrs []netip.Addr, healthy func() bool, log *slog.Logger) *ServiceServers {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if healthy == nil {
		healthy = func() bool { return true }
	}
	if ns == nil {
		ns, _ = netns.Open("")
	}
	return &ServiceServers{ns: ns, addrs: addrs, log: log, healthy: healthy, services: map[model.ServiceName]*serviceServer{}}
}

// Sync makes the set of servers match services: it opens servers for new
// services, closes those of services that left or changed port, and
// updates the endpoint counts. A port that cannot be opened is reported
// (joined with others) and retried on the next Sync; the other services
// still get their servers.
func (s *ServiceServers) Sync(services map[model.ServiceName]ServiceHealth) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, srv := range s.services {
		if h, ok := services[name]; !ok || h.Port != srv.port {
			srv.close()
			delete(s.services, name)
		}
	}
	var errs []error
	for name, h := range services {
		srv := s.services[name]
		if srv == nil {
			var err error
			srv, err = s.open(name, h.Port)
			if err != nil {
				errs = append(errs, &PortError{Service: name, Port: h.Port, Err: err})
				continue
			}
			s.services[name] = srv
		}
		srv.mu.Lock()
		srv.local = h.LocalEndpoints
		srv.mu.Unlock()
	}
	return errors.Join(errs...)
}

// PortError is a health check node port that could not be opened.
type PortError struct {
	Service model.ServiceName // the Service whose port it is
	Port    uint16            // the health check node port
	Err     error             // why it could not be opened
}

// Error names the Service and the port.
func (e *PortError) Error() string {
	return fmt.Sprintf("health check for %s on port %d: %v", e.Service, e.Port, e.Err)
}

// Unwrap returns the listen error.
func (e *PortError) Unwrap() error { return e.Err }

// PortErrors returns the PortErrors in err (as Sync joins them).
func PortErrors(err error) []*PortError {
	var out []*PortError
	var walk func(error)
	walk = func(err error) {
		if pe, ok := err.(*PortError); ok {
			out = append(out, pe)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// Close stops every server.
func (s *ServiceServers) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, srv := range s.services {
		srv.close()
		delete(s.services, name)
	}
}

func (s *ServiceServers) open(name model.ServiceName, port uint16) (*serviceServer, error) {
	hosts := []string{""}
	if len(s.addrs) > 0 {
		hosts = hosts[:0]
		for _, a := range s.addrs {
			hosts = append(hosts, a.String())
		}
	}
	srv := &serviceServer{port: port}
	err := s.ns.Do(func() error {
		for _, h := range hosts {
			l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(port))))
			if err != nil {
				return err
			}
			srv.listeners = append(srv.listeners, l)
		}
		return nil
	})
	if err != nil {
		for _, l := range srv.listeners {
			l.Close()
		}
		return nil, err
	}
	srv.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { srv.serve(w, name, s.healthy()) }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	for _, l := range srv.listeners {
		go func() {
			if err := srv.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("health check server stopped", "service", name.String(), "err", err)
			}
		}()
	}
	return srv, nil
}

type serviceStatus struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (srv *serviceServer) serve(w http.ResponseWriter, name model.ServiceName, healthy bool) {
	srv.mu.Lock()
	local := srv.local
	srv.mu.Unlock()
	var st serviceStatus
	st.Service.Namespace, st.Service.Name = name.Namespace, name.Name
	st.LocalEndpoints, st.ServiceProxyHealthy = local, healthy
	writeJSON(w, local > 0 && healthy, st)
}

func (srv *serviceServer) close() {
	srv.mu.Lock()
	if srv.closed {
		srv.mu.Unlock()
		return
	}
	srv.closed = true
	srv.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.srv.Shutdown(ctx)
}

func writeJSON(w http.ResponseWriter, ok bool, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if ok {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}
