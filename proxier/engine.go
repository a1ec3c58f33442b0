package proxier

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/healthcheck"
	"github.com/proxykit/proxykit/internal/ratelog"
	"github.com/proxykit/proxykit/model"
)

// Engine is the Proxier every backend package returns: it owns the change
// trackers and the sync loop and drives one Backend per IP family.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	runner   *runner
	families []*family
	hooks    []afterSyncHook
	ct       *conntrackHook
	metrics  *metrics
	svcHC    serviceHealthServers // nil: no service health checks
	node     *Node
	ownNode  bool // node was opened by New, for this engine alone
	// hcServed is what the service health check servers were last told;
	// only the sync goroutine touches it.
	hcServed map[model.ServiceName]healthcheck.ServiceHealth
	hcFailed bool // the last health check Sync failed: try it again
	// syncMu is held by a sync and by Inspect and Plan: the backends'
	// methods never run concurrently, and the kernel is read between
	// syncs. It comes before mu.
	syncMu sync.Mutex

	mu             sync.Mutex
	servicesSynced bool
	slicesSynced   bool
	topo           Topology
	nodeIPs        []netip.Addr
	serviceCIDRs   []netip.Prefix // from OnServiceCIDRsChanged
	topoChanged    bool
	eventSeq       uint64 // bumped on every event
	syncedSeq      uint64 // events up to here are programmed
	waiters        []chan struct{}
	running        bool
	closed         bool
	health         Health
	// triggerTimes are the EndpointSlice change times not yet
	// programmed, per family of the slice, from New on.
	triggerTimes map[model.IPFamily][]time.Time
	started      time.Time
	syncing      bool      // a sync has captured eventSeq and runs
	pendingAfter time.Time // first event after that capture
	// The changes not yet programmed (the *_changes_pending gauges):
	// Services and EndpointSlice events since the last capture by a
	// sync (svcPending, epPending) and those captured by syncs that
	// have not succeeded yet (svcTaken, epTaken).
	svcPending, svcTaken map[model.ServiceName]struct{}
	epPending, epTaken   int
	// svcPendingOnly counts the names of svcPending not in svcTaken, so
	// that an event costs the same however many are pending.
	svcPendingOnly int
}

var _ Proxier = (*Engine)(nil)

// family is the per-IP-family half of the engine.
type family struct {
	backend Backend
	tracker *changetracker.Tracker
	// Only the sync goroutine touches the fields below.
	targets  map[model.ServicePortName]*Targets
	changed  map[model.ServicePortName]struct{}
	needFull bool
	// noLocal holds the Local-policy service ports programmed without a
	// local endpoint (noLocalInternal, noLocalExternal), so that the
	// gauge follows changes without a walk over every service.
	noLocal map[model.ServicePortName]uint8
	// full is set by prepare when this sync rewrites everything.
	full bool
	// owners settles conflicting claims on addresses and ports;
	// rejectedNow are the service ports prepare rejected this time.
	owners      *owners
	rejectedNow map[model.ServicePortName]error
	// nInternal and nExternal count noLocal's entries with each bit.
	nInternal, nExternal int
	// health holds the service ports that have a health check node port
	// and an external policy of Local, with their local ready endpoints.
	health map[model.ServicePortName]portHealth
	// objErrs are the service ports the backend could not program, from
	// the object errors of the syncs since the last full one.
	objErrs map[model.ServicePortName]error
	// nOverCapacity counts objErrs' errors that match [ErrCapacity].
	nOverCapacity int
}

// bigMap is the number of entries above which a scratch map is
// replaced rather than cleared.
const bigMap = 64

const (
	noLocalInternal uint8 = 1 << iota
	noLocalExternal
)

// portHealth is what one service port contributes to its Service's health
// check server.
type portHealth struct {
	port  uint16
	local int
}

// afterSyncHook runs after every successful sync of a family with the
// request the backend was given; the conntrack cleanup is one.
type afterSyncHook func(ctx context.Context, b Backend, req *SyncRequest)

// withName adds the proxier's name to log records, when it has one.
func withName(l *slog.Logger, name string) *slog.Logger {
	if name == "" {
		return l
	}
	return l.With("proxier", name)
}

// New returns the Engine driving backends, one per IP family, configured
// by cfg. Backend packages call it from their own New. It fails when two
// backends claim the same family.
func New(cfg Config, backends ...Backend) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if len(backends) == 0 {
		return nil, errors.New("proxier: no backend")
	}
	e := &Engine{
		cfg:    cfg,
		log:    withName(cfg.Logger.With("backend", backends[0].Name()), cfg.Name),
		runner: newRunner(cfg.MinSyncInterval, cfg.SyncPeriod, cfg.RetryInterval),
		topo:   Topology{NodeName: cfg.NodeName},
		// Nothing is programmed yet: the first sync is pending from
		// now, so /healthz turns 503 when the initial lists do not
		// arrive within the health timeout.
		health:       Health{OldestPending: time.Now()},
		started:      time.Now(),
		triggerTimes: map[model.IPFamily][]time.Time{},
		svcPending:   map[model.ServiceName]struct{}{},
		svcTaken:     map[model.ServiceName]struct{}{},
	}
	var err error
	if e.metrics, err = newMetrics(cfg, backends[0].Name()); err != nil {
		return nil, fmt.Errorf("proxier: %w", err)
	}
	// Bad objects are logged per object; a flood of them is rate limited.
	trackerLog := slog.New(ratelog.New(cfg.Logger.Handler(), time.Minute, 20))
	seen := map[model.IPFamily]bool{}
	for _, b := range backends {
		f := b.Family()
		if f != model.IPv4 && f != model.IPv6 {
			return nil, fmt.Errorf("proxier: backend %s has invalid family %v", b.Name(), f)
		}
		if seen[f] {
			return nil, fmt.Errorf("proxier: two backends for %v", f)
		}
		seen[f] = true
		e.families = append(e.families, &family{
			backend: b,
			tracker: changetracker.New(changetracker.Config{
				Family:           f,
				NodeName:         cfg.NodeName,
				ServiceProxyName: cfg.ServiceProxyName,
				Logger:           trackerLog.With("family", f.String()),
			}),
			targets:  map[model.ServicePortName]*Targets{},
			changed:  map[model.ServicePortName]struct{}{},
			needFull: true,
			noLocal:  map[model.ServicePortName]uint8{},
			health:   map[model.ServicePortName]portHealth{},
			objErrs:  map[model.ServicePortName]error{},
			owners:   newOwners(),
		})
	}
	if e.node = cfg.Node; e.node == nil {
		node, err := NewNode(NodeConfig{NetNS: cfg.NetNS, NodePortAddresses: cfg.NodePortAddresses, Logger: e.log})
		if err != nil {
			return nil, err
		}
		e.node, e.ownNode = node, true
	} else if cfg.NetNS != e.node.NetNS() {
		return nil, fmt.Errorf("proxier: Config.NetNS %q is not the namespace of Config.Node (%q)", cfg.NetNS, e.node.NetNS())
	}
	if !cfg.NoServiceHealthChecks {
		timeout := cfg.HealthTimeout
		if timeout <= 0 {
			timeout = DefaultHealthTimeout
		}
		if e.svcHC = e.node.serviceHealth(e, func() bool { return e.Health().Healthy(time.Now(), timeout) }); e.svcHC == nil {
			e.log.Warn("no address of the namespace is in NodePortAddresses; health check node ports are not served", "nodePortAddresses", fmt.Sprint(cfg.NodePortAddresses))
		}
	}
	if !cfg.NoConntrackCleanup {
		ct, err := newConntrackHook(e.node, e.log, e.metrics.conntrackDeleted, e.metrics.conntrackDuration)
		if err != nil {
			e.closeNode()
			return nil, err
		}
		e.ct = ct
		e.hooks = append(e.hooks, ct.afterSync)
	}
	return e, nil
}

// closeNode leaves the Node, closing it if New opened it.
func (e *Engine) closeNode() error {
	if e.svcHC != nil {
		e.svcHC.Close()
	}
	if e.ownNode {
		return e.node.Close()
	}
	return nil
}

// event records that something changed and asks for a sync.
func (e *Engine) event(apply func()) {
	e.mu.Lock()
	apply()
	e.eventSeq++
	now := time.Now()
	if e.health.OldestPending.IsZero() {
		e.health.OldestPending = now
	}
	if e.syncing && e.pendingAfter.IsZero() {
		e.pendingAfter = now
	}
	e.mu.Unlock()
	e.runner.request()
	e.metrics.queued(e.families)
}

// setPending sets the *_changes_pending gauges. The caller holds e.mu.
func (e *Engine) setPending() {
	e.metrics.servicePending.Set(float64(len(e.svcTaken) + e.svcPendingOnly))
	e.metrics.endpointPending.Set(float64(e.epPending + e.epTaken))
}

// OnServiceAdd implements [ServiceHandler].
func (e *Engine) OnServiceAdd(svc *v1.Service) { e.OnServiceUpdate(nil, svc) }

// OnServiceUpdate implements [ServiceHandler].
func (e *Engine) OnServiceUpdate(oldSvc, svc *v1.Service) {
	e.event(func() {
		for _, f := range e.families {
			f.tracker.OnService(oldSvc, svc)
		}
		if s := cmp.Or(svc, oldSvc); s != nil {
			name := model.ServiceName{Namespace: s.Namespace, Name: s.Name}
			_, pending := e.svcPending[name]
			_, taken := e.svcTaken[name]
			if !pending && !taken {
				e.svcPendingOnly++
			}
			e.svcPending[name] = struct{}{}
			e.setPending()
		}
	})
	e.metrics.serviceChanges.Inc()
}

// OnServiceDelete implements [ServiceHandler].
func (e *Engine) OnServiceDelete(svc *v1.Service) { e.OnServiceUpdate(svc, nil) }

// OnServiceSynced implements [ServiceHandler].
func (e *Engine) OnServiceSynced() { e.event(func() { e.servicesSynced = true }) }

// OnEndpointSliceAdd implements [EndpointSliceHandler].
func (e *Engine) OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice) {
	e.OnEndpointSliceUpdate(nil, slice)
}

// OnEndpointSliceUpdate implements [EndpointSliceHandler].
func (e *Engine) OnEndpointSliceUpdate(_, slice *discoveryv1.EndpointSlice) {
	trigger := triggerTime(slice)
	fam, famOK := sliceFamily(slice)
	e.event(func() {
		// As kube-proxy, only changes made since the proxier started
		// count: the initial list holds old times.
		if famOK && trigger.After(e.started) {
			e.triggerTimes[fam] = append(e.triggerTimes[fam], trigger)
		}
		for _, f := range e.families {
			f.tracker.OnEndpointSlice(slice, false)
		}
		e.epPending++
		e.setPending()
	})
	e.metrics.endpointChanges.Inc()
}

// OnEndpointSliceDelete implements [EndpointSliceHandler].
func (e *Engine) OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice) {
	e.event(func() {
		for _, f := range e.families {
			f.tracker.OnEndpointSlice(slice, true)
		}
		e.epPending++
		e.setPending()
	})
	e.metrics.endpointChanges.Inc()
}

// OnEndpointSlicesSynced implements [EndpointSliceHandler].
func (e *Engine) OnEndpointSlicesSynced() { e.event(func() { e.slicesSynced = true }) }

// OnNodeAdd implements [NodeHandler].
func (e *Engine) OnNodeAdd(node *v1.Node) { e.OnNodeUpdate(nil, node) }

// OnNodeUpdate implements [NodeHandler]. Nodes other than this proxier's
// own are ignored.
func (e *Engine) OnNodeUpdate(_, node *v1.Node) {
	if node == nil || node.Name != e.cfg.NodeName {
		return
	}
	zone := node.Labels[v1.LabelTopologyZone]
	// InternalIPs first, then ExternalIPs: the first of a family is the
	// node's primary address, as kube-proxy picks it.
	var ips []netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	terminating := nodeTerminating(node)
	e.event(func() {
		if zone != e.topo.Zone {
			e.topo.Zone = zone
			e.topoChanged = true
		}
		e.nodeIPs = ips
		e.health.NodeTerminating = terminating
	})
}

// OnNodeDelete implements [NodeHandler].
func (e *Engine) OnNodeDelete(node *v1.Node) {
	if node == nil || node.Name != e.cfg.NodeName {
		return
	}
	e.event(func() {
		if e.topo.Zone != "" {
			e.topo.Zone = ""
			e.topoChanged = true
		}
		e.health.NodeTerminating = true
	})
}

// OnNodeSynced implements [NodeHandler].
func (e *Engine) OnNodeSynced() {}

// OnServiceCIDRsChanged implements [ServiceCIDRHandler].
func (e *Engine) OnServiceCIDRsChanged(cidrs []netip.Prefix) {
	cidrs = slices.Clone(cidrs)
	e.event(func() { e.serviceCIDRs = cidrs })
}

// familyCIDRs returns the valid prefixes of f in a and b, masked, sorted
// and without repeats.
func familyCIDRs(f model.IPFamily, a, b []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range slices.Concat(a, b) {
		if !p.IsValid() || !f.Contains(p.Addr()) {
			continue
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	return slices.Compact(out)
}

// Sync implements [Proxier].
func (e *Engine) Sync() {
	e.runner.request()
	e.metrics.queued(e.families)
}

// Flush implements [Proxier].
func (e *Engine) Flush(ctx context.Context) error {
	e.mu.Lock()
	target := e.eventSeq
	if e.syncedSeq >= target && e.servicesSynced && e.slicesSynced {
		e.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	e.waiters = append(e.waiters, ch)
	e.mu.Unlock()
	e.runner.request()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("proxier: flush: %w", ctx.Err())
		case <-ch:
		}
		e.mu.Lock()
		if e.syncedSeq >= target {
			e.mu.Unlock()
			return nil
		}
		e.waiters = append(e.waiters, ch)
		e.mu.Unlock()
	}
}

// Run implements [Proxier].
func (e *Engine) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running || e.closed {
		e.mu.Unlock()
		return errors.New("proxier: Run called twice or after Close")
	}
	e.running = true
	e.health.Running = true
	e.health.LastLoop = time.Now()
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.health.Running = false
		e.mu.Unlock()
	}()
	e.runner.request()
	e.metrics.queued(e.families)
	e.runner.loop(ctx, e.syncOnce, time.Now)
	return nil
}

// syncOnce applies pending changes and syncs every family. It reports
// whether all families synced, and whether the engine was ready to sync.
func (e *Engine) syncOnce(ctx context.Context, periodic bool) (ok, ready bool) {
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	e.mu.Lock()
	e.health.LastLoop = time.Now()
	if !e.servicesSynced || !e.slicesSynced {
		e.mu.Unlock()
		return false, false
	}
	seq := e.eventSeq
	e.syncing, e.pendingAfter = true, time.Time{}
	triggers := e.triggerTimes
	e.triggerTimes = map[model.IPFamily][]time.Time{}
	if len(e.svcTaken) == 0 {
		// Nothing taken waits for a retry: take the pending set whole
		// (the initial list's 100,000 names need no copy).
		e.svcTaken, e.svcPending = e.svcPending, e.svcTaken
	} else {
		maps.Copy(e.svcTaken, e.svcPending)
		clear(e.svcPending)
	}
	e.svcPendingOnly = 0
	e.epTaken += e.epPending
	e.epPending = 0
	topo := e.topo
	topoChanged := e.topoChanged
	e.topoChanged = false
	nodeIPs := e.nodeIPs
	serviceCIDRs := e.serviceCIDRs
	results := make([]changetracker.Result, len(e.families))
	for i, f := range e.families {
		results[i] = f.tracker.Apply()
	}
	e.mu.Unlock()

	for i, f := range e.families {
		if len(f.changed) == 0 {
			// The usual case, and the first sync's 100,000 names:
			// the result is ours to keep.
			f.changed = results[i].Changed
		} else {
			maps.Copy(f.changed, results[i].Changed)
		}
		if topoChanged {
			f.needFull = true
		}
		f.prepare(periodic, topo)
	}
	// Health check node ports answer in the safe order around the
	// dataplane: a count that falls is served before the backends stop
	// sending traffic to the local endpoints that left, a count that
	// rises only after they accept it.
	want := e.wantServiceHealth()
	e.serveServiceHealth(lowerServiceHealth(e.hcServed, want))
	ok = true
	for _, f := range e.families {
		fam := f.backend.Family()
		if !e.syncFamily(ctx, f, nodeIPs, familyCIDRs(fam, e.cfg.ServiceCIDRs, serviceCIDRs)) {
			ok = false
			continue
		}
		e.metrics.observeProgramming(fam, triggers[fam], time.Now())
		delete(triggers, fam)
	}
	if ok {
		// A failed sync leaves the lowered counts: the dataplane may be
		// in its old or its new state, and the lower count is true of
		// both.
		e.serveServiceHealth(want)
		e.mu.Lock()
		if seq > e.syncedSeq {
			e.syncedSeq = seq
		}
		e.health.LastSync = time.Now()
		e.health.OldestPending = e.pendingAfter
		if len(e.svcTaken) > bigMap {
			// A map never shrinks, and clearing or copying one costs
			// its size: let the initial list's go.
			e.svcTaken = map[model.ServiceName]struct{}{}
		} else {
			clear(e.svcTaken)
		}
		e.svcPendingOnly = len(e.svcPending)
		e.epTaken = 0
		e.setPending()
		// Flush waiters wake once the dataplane and the health check
		// node ports both match what was synced.
		for _, w := range e.waiters {
			select {
			case w <- struct{}{}:
			default:
			}
		}
		e.waiters = nil
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.syncing = false
	// The families that failed measure their changes when they succeed.
	for fam, ts := range triggers {
		e.triggerTimes[fam] = append(ts, e.triggerTimes[fam]...)
	}
	e.mu.Unlock()
	return ok, true
}

// prepare brings the family's targets and health check counts up to its
// tracker's state: every service port on a full sync (needFull or
// periodic), else the changed ones. It first settles which service port
// owns each address and port ([owners]); a rejected one is left out, as
// if it did not exist.
func (f *family) prepare(periodic bool, topo Topology) {
	state := f.tracker.State()
	f.full = f.needFull || periodic
	var flipped []model.ServicePortName
	var rejected map[model.ServicePortName]error
	if f.full {
		flipped, rejected = f.owners.updateAll(state.Services)
	} else {
		flipped, rejected = f.owners.update(state.Services, slices.Collect(maps.Keys(f.changed)))
	}
	for _, name := range flipped {
		f.changed[name] = struct{}{}
	}
	f.rejectedNow = rejected
	service := func(name model.ServicePortName) *model.ServicePort {
		if !f.owners.accepted(name) {
			return nil
		}
		return state.Services[name]
	}
	if f.full {
		// Recompute every target: topology or policies may have moved.
		// One walk over the state, looking up each name as little as
		// possible: at 100,000 service ports every lookup is a cache
		// miss.
		next := make(map[model.ServicePortName]*Targets, len(state.Services))
		clear(f.health)
		for name, sp := range state.Services {
			if !f.owners.accepted(name) {
				continue
			}
			eps := state.Endpoints[name]
			t := SelectTargets(sp, eps, topo)
			if !t.Equal(f.targets[name]) {
				f.changed[name] = struct{}{}
			}
			next[name] = t
			f.updateHealth(name, sp, eps)
		}
		for name := range f.targets {
			if _, ok := next[name]; !ok {
				f.changed[name] = struct{}{}
			}
		}
		f.targets = next
		return
	}
	for name := range f.changed {
		sp := service(name)
		if sp == nil {
			delete(f.targets, name)
		} else {
			f.targets[name] = SelectTargets(sp, state.Endpoints[name], topo)
		}
		f.updateHealth(name, sp, state.Endpoints[name])
	}
}

// view is the state the backend is given: the tracker's, less the
// service ports rejected for claiming what another one owns.
func (f *family) view() *model.State {
	state := f.tracker.State()
	if len(f.owners.rejected) == 0 {
		return state
	}
	v := &model.State{Family: state.Family, Endpoints: state.Endpoints,
		Services: make(map[model.ServicePortName]*model.ServicePort, len(state.Services))}
	for name, sp := range state.Services {
		if f.owners.accepted(name) {
			v.Services[name] = sp
		}
	}
	return v
}

// syncFamily programs what prepare left in f into its backend and
// reports whether the backend took it.
func (e *Engine) syncFamily(ctx context.Context, f *family, nodeIPs []netip.Addr, serviceCIDRs []netip.Prefix) bool {
	state := f.view()
	full := f.full
	fam := f.backend.Family().String()
	for _, name := range slices.SortedFunc(maps.Keys(f.rejectedNow), model.ServicePortName.Compare) {
		e.log.Warn("service port rejected: it claims what another service port owns; it is not programmed until that one lets go",
			"family", fam, "service", name.String(), "err", f.rejectedNow[name])
	}
	f.rejectedNow = nil
	e.metrics.conflicts.WithLabelValues(fam).Set(float64(len(f.owners.rejected)))
	var ips []netip.Addr
	for _, ip := range nodeIPs {
		if f.backend.Family().Contains(ip) {
			ips = append(ips, ip)
		}
	}
	req := &SyncRequest{Full: full, State: state, Targets: f.targets, Changed: f.changed, NodeIPs: ips, ServiceCIDRs: serviceCIDRs}
	start := time.Now()
	err := f.backend.Sync(ctx, req)
	log := e.log.With("family", fam, "full", full, "changed", len(f.changed))
	if err != nil && !OnlyObjectErrors(err) && !full && ctx.Err() == nil {
		// A partial sync failed: the kernel is not what the backend
		// thought (a table deleted behind its back, say). Converge
		// everything at once rather than after the retry interval.
		e.metrics.observeSync(fam, false, time.Since(start), false)
		log.Warn("partial sync failed; running a full sync at once", "err", err, "duration", time.Since(start))
		full = true
		req.Full = true
		log = e.log.With("family", fam, "full", full, "changed", len(f.changed))
		start = time.Now()
		err = f.backend.Sync(ctx, req)
	}
	if err != nil && !OnlyObjectErrors(err) {
		e.metrics.observeSync(fam, full, time.Since(start), false)
		f.needFull = true
		if ctx.Err() != nil {
			// Stopping: not a failure of the dataplane.
			log.Info("sync interrupted by shutdown", "err", err)
			return false
		}
		if errors.Is(err, ErrNotApplied) {
			log.Error("sync failed; the previous dataplane stays in force", "err", err, "duration", time.Since(start))
		} else {
			log.Error("sync failed; the dataplane may be partly updated until a full sync succeeds", "err", err, "duration", time.Since(start))
		}
		return false
	}
	if full {
		clear(f.objErrs)
		f.nOverCapacity = 0
	} else {
		for name := range f.changed {
			f.setObjErr(name, nil)
		}
	}
	if err != nil {
		for _, oe := range objectErrors(err) {
			log.Warn("service port skipped", "service", oe.Service.String(), "err", oe.Err)
			f.setObjErr(oe.Service, oe.Err)
		}
	}
	e.metrics.overCapacity.WithLabelValues(fam).Set(float64(f.nOverCapacity))
	e.metrics.observeSync(fam, full, time.Since(start), true)
	if full {
		clear(f.noLocal)
		f.nInternal, f.nExternal = 0, 0
		for name, sp := range state.Services {
			f.updateNoLocal(name, sp)
		}
	} else {
		for name := range f.changed {
			f.updateNoLocal(name, state.Services[name])
		}
	}
	// kube-proxy's traffic_policy values.
	e.metrics.noLocalEndpoints.WithLabelValues("internal", fam).Set(float64(f.nInternal))
	e.metrics.noLocalEndpoints.WithLabelValues("external", fam).Set(float64(f.nExternal))
	log.Debug("synced", "duration", time.Since(start), "services", len(state.Services))
	for _, h := range e.hooks {
		h(ctx, f.backend, req)
	}
	f.changed = map[model.ServicePortName]struct{}{}
	f.needFull = false
	return true
}

// serviceHealthServers is what the engine needs of the service health
// check servers ([healthcheck.ServiceServers]).
type serviceHealthServers interface {
	Sync(map[model.ServiceName]healthcheck.ServiceHealth) error
	Close()
}

// wantServiceHealth is what the health check servers of Services with
// externalTrafficPolicy Local should answer once every family is synced.
func (e *Engine) wantServiceHealth() map[model.ServiceName]healthcheck.ServiceHealth {
	if e.svcHC == nil {
		return nil
	}
	want := map[model.ServiceName]healthcheck.ServiceHealth{}
	for _, f := range e.families {
		for name, ph := range f.health {
			h := want[name.ServiceName]
			h.Port = ph.port
			h.LocalEndpoints = max(h.LocalEndpoints, ph.local)
			want[name.ServiceName] = h
		}
	}
	return want
}

// lowerServiceHealth is what the health check servers may answer while
// the dataplane moves from what served describes to what want does: each
// Service keeps its served port with the lower of both counts (0 when it
// is leaving), and a Service that is new gets no server yet.
func lowerServiceHealth(served, want map[model.ServiceName]healthcheck.ServiceHealth) map[model.ServiceName]healthcheck.ServiceHealth {
	low := make(map[model.ServiceName]healthcheck.ServiceHealth, len(served))
	for name, h := range served {
		if w, ok := want[name]; ok {
			h.LocalEndpoints = min(h.LocalEndpoints, w.LocalEndpoints)
		} else {
			h.LocalEndpoints = 0
		}
		low[name] = h
	}
	return low
}

// serveServiceHealth opens, closes and updates the health check servers
// so that they answer want, unless they already do.
func (e *Engine) serveServiceHealth(want map[model.ServiceName]healthcheck.ServiceHealth) {
	if e.svcHC == nil || (!e.hcFailed && maps.Equal(want, e.hcServed)) {
		return
	}
	err := e.svcHC.Sync(want)
	if err != nil {
		e.log.Warn("service health checks", "err", err)
		if f := e.cfg.ServiceHealthError; f != nil {
			for _, pe := range healthcheck.PortErrors(err) {
				f(pe.Service, pe.Port, pe.Err)
			}
		}
	}
	e.hcServed, e.hcFailed = want, err != nil
}

// sliceFamily returns the IP family of slice's addresses; false for FQDN
// slices.
func sliceFamily(slice *discoveryv1.EndpointSlice) (model.IPFamily, bool) {
	if slice == nil {
		return 0, false
	}
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4:
		return model.IPv4, true
	case discoveryv1.AddressTypeIPv6:
		return model.IPv6, true
	}
	return 0, false
}

// triggerTime returns slice's endpoints.kubernetes.io/last-change-trigger-time,
// or the zero Time.
func triggerTime(slice *discoveryv1.EndpointSlice) time.Time {
	if slice == nil {
		return time.Time{}
	}
	// The control plane sets it to when the change behind the slice's
	// last update happened.
	v, ok := slice.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// updateHealth records what service port name, which sp (nil: none)
// describes now, contributes to its Service's health check server.
func (f *family) updateHealth(name model.ServicePortName, sp *model.ServicePort, eps []*model.Endpoint) {
	if sp == nil || sp.HealthCheckNodePort == 0 || !sp.ExternalLocal() {
		delete(f.health, name)
		return
	}
	local := 0
	for _, ep := range eps {
		if ep.Local && ep.Ready {
			local++
		}
	}
	f.health[name] = portHealth{port: sp.HealthCheckNodePort, local: local}
}

// updateNoLocal records whether service port name, which sp (nil: none)
// describes now, is programmed without the local endpoints its policies
// ask for.
func (f *family) updateNoLocal(name model.ServicePortName, sp *model.ServicePort) {
	var bits uint8
	if t := f.targets[name]; sp != nil && t != nil && t.HasEndpoints {
		if sp.InternalLocal() && len(t.Internal) == 0 {
			bits |= noLocalInternal
		}
		if sp.ExternalLocal() && len(t.External) == 0 {
			bits |= noLocalExternal
		}
	}
	old := f.noLocal[name]
	f.nInternal += has(bits, noLocalInternal) - has(old, noLocalInternal)
	f.nExternal += has(bits, noLocalExternal) - has(old, noLocalExternal)
	if bits == 0 {
		delete(f.noLocal, name)
		return
	}
	f.noLocal[name] = bits
}

// has returns 1 if bits has bit set, else 0.
func has(bits, bit uint8) int {
	if bits&bit != 0 {
		return 1
	}
	return 0
}

// setObjErr records that the backend could not program name because of
// err (nil: it could), keeping nOverCapacity in step.
func (f *family) setObjErr(name model.ServicePortName, err error) {
	if old, ok := f.objErrs[name]; ok && errors.Is(old, ErrCapacity) {
		f.nOverCapacity--
	}
	if err == nil {
		delete(f.objErrs, name)
		return
	}
	f.objErrs[name] = err
	if errors.Is(err, ErrCapacity) {
		f.nOverCapacity++
	}
}

func objectErrors(err error) []*ObjectError {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var out []*ObjectError
		for _, e := range joined.Unwrap() {
			out = append(out, objectErrors(e)...)
		}
		return out
	}
	if oe, ok := err.(*ObjectError); ok {
		return []*ObjectError{oe}
	}
	return nil
}

// Cleanup implements [Proxier]: every backend removes what it created.
func (e *Engine) Cleanup(ctx context.Context) error {
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	var errs []error
	for _, f := range e.families {
		if err := f.backend.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s %s cleanup: %w", f.backend.Name(), f.backend.Family(), err))
		}
	}
	return errors.Join(errs...)
}

// Close implements [Proxier].
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	var errs []error
	if err := e.closeNode(); err != nil {
		errs = append(errs, err)
	}
	for _, f := range e.families {
		if err := f.backend.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// NewPerFamily builds one backend per family of cfg.Families (both when
// empty) with newBackend and returns the engine around them, the way a
// backend package's New does. On any error the backends already built are
// closed.
func NewPerFamily(cfg Config, newBackend func(model.IPFamily) (Backend, error)) (*Engine, error) {
	cfg = cfg.WithDefaults()
	var backends []Backend
	closeAll := func() {
		for _, b := range backends {
			b.Close()
		}
	}
	for _, f := range cfg.Families {
		b, err := newBackend(f)
		if err != nil {
			closeAll()
			return nil, err
		}
		backends = append(backends, b)
	}
	e, err := New(cfg, backends...)
	if err != nil {
		closeAll()
		return nil, err
	}
	return e, nil
}
