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
	last := c.last[fam]
	if last == nil {
		last = map[model.ServicePortName]*model.ServicePort{}
		c.last[fam] = last
	}
	valid := conntrack.Valid{}
	consider := func(name model.ServicePortName) {
		sp := req.State.Services[name]
		if sp == nil {
			if old := last[name]; old != nil {
				if old.Protocol.Connectionless() {
					addFrontends(valid, old, nil, nil) // deleted: nothing is valid
				}
				delete(last, name)
			}
			return
		}
		if !sp.Protocol.Connectionless() {
			if old := last[name]; old != sp {
				addMissing(valid, sp, old, false)
			}
			last[name] = sp
			return
		}
		var internal, external []*model.Endpoint
		if t := req.Targets[name]; t != nil {
			internal, external = t.Internal, externalReplies(sp, t)
		}
		addFrontends(valid, sp, internal, external)
		if old := last[name]; old != nil && old != sp {
			// Addresses the port no longer has are dead too.
			addMissing(valid, old, sp, true)
		}
		last[name] = sp
	}
	if req.Full {
		for name := range req.State.Services {
			consider(name)
		}
		for name := range last {
			if _, ok := req.State.Services[name]; !ok {
				consider(name)
			}
		}
	} else {
		for name := range req.Changed {
			consider(name)
		}
	}
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

// externalReplies returns the endpoints that may answer flows to the
// external addresses of sp: its external targets and, for policy Local,
// the short-circuit ones that pods and the node reach there.
func externalReplies(sp *model.ServicePort, t *Targets) []*model.Endpoint {
	if sp.ExternalLocal() {
		return slices.Concat(t.External, t.ShortCircuit())
	}
	return t.External
}

func addFrontends(valid conntrack.Valid, sp *model.ServicePort, internal, external []*model.Endpoint) {
	fe := func(a netip.Addr, port uint16) conntrack.Frontend {
		return conntrack.Frontend{Addr: netip.AddrPortFrom(a, port), Protocol: sp.Protocol}
	}
	add := func(f conntrack.Frontend, eps []*model.Endpoint) {
		valid.Add(f, netip.AddrPort{})
		for _, ep := range eps {
			valid.Add(f, ep.Addr)
		}
	}
	if sp.ClusterIP.IsValid() {
		add(fe(sp.ClusterIP, sp.Port), internal)
	}
	for _, ip := range sp.ExternalIPs {
		add(fe(ip, sp.Port), external)
	}
	for _, ip := range sp.LoadBalancerIPs {
		add(fe(ip, sp.Port), external)
	}
	if sp.NodePort != 0 {
		add(fe(netip.Addr{}, sp.NodePort), external)
	}
}

// addMissing marks the frontends that sp has and other, which may be nil,
// has not as having no valid endpoint; node-port frontends only when
// withNodePorts. For a connectionless port, with sp the old one, these are
// the addresses it no longer has; for a TCP port, with sp the new one, the
// addresses just programmed, whose untranslated SYNs are to be deleted.
func addMissing(valid conntrack.Valid, sp, other *model.ServicePort, withNodePorts bool) {
	have := conntrack.Valid{}
	addFrontends(have, sp, nil, nil)
	had := conntrack.Valid{}
	if other != nil {
		addFrontends(had, other, nil, nil)
	}
	for f := range have {
		if _, ok := had[f]; !ok && (withNodePorts || f.Addr.Addr().IsValid()) {
			valid.Add(f, netip.AddrPort{})
		}
	}
}
