package proxier

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/internal/conntrack"
	"github.com/proxykit/proxykit/model"
)

// conntrackHook deletes stale UDP and SCTP flows after each sync, and the
// untranslated TCP SYNs left to service addresses that have just been
// programmed.
type conntrackHook struct {
	log  *slog.Logger
	node *Node
	// deleted and duration are labelled ip_family.
	deleted  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// last programmed ports per family, so flows to a deleted service can
	// still be found and a TCP address that is new can be told from one
	// already programmed.
	last map[model.IPFamily]map[model.ServicePortName]*model.ServicePort
}

func newConntrackHook(node *Node, log *slog.Logger, deleted *prometheus.CounterVec, duration *prometheus.HistogramVec) (*conntrackHook, error) {
	if err := node.openConntrack(); err != nil {
		return nil, err
	}
	return &conntrackHook{
		log:      log,
		node:     node,
		deleted:  deleted,
		duration: duration,
		last:     map[model.IPFamily]map[model.ServicePortName]*model.ServicePort{},
	}, nil
}

func (c *conntrackHook) afterSync(ctx context.Context, b Backend, req *SyncRequest) {
	fam := b.Family()
	valid := c.valid(fam, req)
	if len(valid) == 0 {
		return
	}
	start := time.Now()
	n, err := c.node.cleanConntrack(fam, valid)
	c.duration.WithLabelValues(fam.String()).Observe(time.Since(start).Seconds())
	if err != nil {
		c.log.Warn("conntrack cleanup failed", "family", fam.String(), "err", err)
	}
	if n > 0 {
		c.deleted.WithLabelValues(fam.String()).Add(float64(n))
		c.log.Debug("deleted stale conntrack flows", "family", fam.String(), "flows", n)
	}
}

// valid returns what the cleanup after a sync of family fam with req
// must look at, and remembers the service ports req programmed.
func (c *conntrackHook) valid(fam model.IPFamily, req *SyncRequest) conntrack.Valid {
	services := req.State.Services
	last := c.last[fam]
	valid := conntrack.Valid{}
	if last == nil {
		// The first sync: every TCP address is new and goes into
		// valid; neither map grows entry by entry.
		last = make(map[model.ServicePortName]*model.ServicePort, len(services))
		c.last[fam] = last
		valid = make(conntrack.Valid, len(services))
	}
	consider := func(name model.ServicePortName, sp *model.ServicePort) {
		old := last[name]
		if sp == nil {
			if old != nil {
				if old.Protocol.Connectionless() {
					addFrontends(valid, old, nil, nil) // deleted: nothing is valid
				}
				delete(last, name)
			}
			return
		}
		if old != sp {
			last[name] = sp
		}
		if !sp.Protocol.Connectionless() {
			if old != sp {
				addMissing(valid, sp, old, false)
			}
			return
		}
		var internal, external []*model.Endpoint
		if t := req.Targets[name]; t != nil {
			internal, external = t.Internal, externalReplies(sp, t)
		}
		addFrontends(valid, sp, internal, external)
		if old != nil && old != sp {
			// Addresses the port no longer has are dead too.
			addMissing(valid, old, sp, true)
		}
	}
	if req.Full {
		// The ports that went first, while last holds only what was
		// programmed before: a first sync walks nothing here.
		for name := range last {
			if _, ok := services[name]; !ok {
				consider(name, nil)
			}
		}
		for name, sp := range services {
			consider(name, sp)
		}
	} else {
		for name := range req.Changed {
			consider(name, services[name])
		}
	}
	return valid
}

// externalReplies returns the endpoints that may answer flows to the
// external addresses of sp: its external targets and, for policy Local,
// the short-circuit ones that pods and the node reach there.
func externalReplies(sp *model.ServicePort, t *Targets) []*model.Endpoint {
	if sp.ExternalLocal() {
		return slices.Concat(t.External, t.ShortCircuit())
	}
	return t.External
}

// addFrontends records the frontends of sp in valid: the cluster IP's
// with the internal endpoints, the others with the external ones.
func addFrontends(valid conntrack.Valid, sp *model.ServicePort, internal, external []*model.Endpoint) {
	add := func(a netip.Addr, port uint16, eps []*model.Endpoint) {
		f := conntrack.Frontend{Addr: netip.AddrPortFrom(a, port), Protocol: sp.Protocol}
		mark(valid, f)
		for _, ep := range eps {
			valid.Add(f, ep.Addr)
		}
	}
	if sp.ClusterIP.IsValid() {
		add(sp.ClusterIP, sp.Port, internal)
	}
	for _, ip := range sp.ExternalIPs {
		add(ip, sp.Port, external)
	}
	for _, ip := range sp.LoadBalancerIPs {
		add(ip, sp.Port, external)
	}
	if sp.NodePort != 0 {
		add(netip.Addr{}, sp.NodePort, external)
	}
}

// mark records fe in valid, with no endpoint unless it has some already.
// Unlike [conntrack.Valid.Add] it allocates no endpoint set (a nil set is
// an empty one to the cleaner): a first sync marks every TCP address.
func mark(valid conntrack.Valid, fe conntrack.Frontend) {
	if _, ok := valid[fe]; !ok {
		valid[fe] = nil
	}
}

// frontends appends the frontends of sp to dst, as addFrontends records
// them.
func frontends(dst []conntrack.Frontend, sp *model.ServicePort) []conntrack.Frontend {
	fe := func(a netip.Addr, port uint16) conntrack.Frontend {
		return conntrack.Frontend{Addr: netip.AddrPortFrom(a, port), Protocol: sp.Protocol}
	}
	if sp.ClusterIP.IsValid() {
		dst = append(dst, fe(sp.ClusterIP, sp.Port))
	}
	for _, ip := range sp.ExternalIPs {
		dst = append(dst, fe(ip, sp.Port))
	}
	for _, ip := range sp.LoadBalancerIPs {
		dst = append(dst, fe(ip, sp.Port))
	}
	if sp.NodePort != 0 {
		dst = append(dst, fe(netip.Addr{}, sp.NodePort))
	}
	return dst
}

// addMissing marks the frontends that sp has and other, which may be nil,
// has not as having no valid endpoint; node-port frontends only when
// withNodePorts. For a connectionless port, with sp the old one, these are
// the addresses it no longer has; for a TCP port, with sp the new one, the
// addresses just programmed, whose untranslated SYNs are to be deleted.
func addMissing(valid conntrack.Valid, sp, other *model.ServicePort, withNodePorts bool) {
	var haveBuf, hadBuf [4]conntrack.Frontend
	have := frontends(haveBuf[:0], sp)
	var had []conntrack.Frontend
	if other != nil {
		had = frontends(hadBuf[:0], other)
	}
	for _, f := range have {
		if !slices.Contains(had, f) && (withNodePorts || f.Addr.Addr().IsValid()) {
			mark(valid, f)
		}
	}
}
