package changetracker

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/model"
)

// Config configures a [Tracker].
type Config struct {
	// Family is the IP family the tracker keeps; addresses of the other
	// family are left out. It is required: New panics unless it is
	// [model.IPv4] or [model.IPv6].
	Family model.IPFamily
	// NodeName is the name of the node the proxy runs on. Endpoints whose
	// NodeName equals it are marked Local. Empty means no endpoint is
	// local.
	NodeName string
	// ServiceProxyName selects the Services to track by their
	// service.kubernetes.io/service-proxy-name label. When empty, the
	// tracker keeps the Services without that label; when set, it keeps
	// exactly the Services whose label has this value.
	ServiceProxyName string
	// Logger receives a line for every piece of input that is dropped,
	// with the Service or EndpointSlice it came from. The tracker adds no
	// attribute of its own (not even the family), so the caller can add
	// its context once. Nil discards the lines.
	Logger *slog.Logger
}

// Tracker tracks the Services and EndpointSlices of one IP family and keeps
// the [model.State] they describe. Create it with [New]. It is not safe for
// concurrent use; see the package documentation for the full contract.
type Tracker struct {
	family    model.IPFamily
	nodeName  string
	proxyName string
	log       *slog.Logger

	state model.State

	// svcs holds what is applied of each Service: its service ports,
	// its slices and the keys it owns in state.Endpoints.
	svcs map[model.ServiceName]*svcEntry
	// svcPending holds the ports each Service with a pending change will
	// have after Apply; an empty list removes the Service.
	svcPending map[model.ServiceName][]*model.ServicePort

	// slices holds every applied EndpointSlice that contributes to this
	// family.
	slices map[sliceID]*sliceInfo
	// slicePending holds the pending state of each changed slice; nil
	// means the slice no longer contributes.
	slicePending map[sliceID]*sliceInfo

	// The largest sizes the pending maps reached since they were last
	// allocated. Go maps never shrink, and iterating or clearing one costs
	// its capacity, so Apply replaces a map that grew big (an initial
	// load) instead of clearing it.
	svcPeak, slicePeak int

	// Scratch space reused by Apply.
	affected []model.ServiceName
	cands    []candidate
	spare    []candidate // all zero; see mergeChanged
	matched  []*model.Endpoint
	names    []model.ServicePortName
}

// svcEntry is what the tracker has applied of one Service, from the
// Service object and from its EndpointSlices.
type svcEntry struct {
	// ports are the Service's ports in state.Services.
	ports []*model.ServicePort
	// slices are the Service's slices, in no particular order.
	slices []*sliceInfo
	// epPorts are the keys the Service owns in state.Endpoints.
	epPorts []model.ServicePortName
	// merged are the sorted candidates of a big Service, or nil.
	merged *mergedCands
}

// entry returns the entry of a Service, creating it if needed.
func (t *Tracker) entry(name model.ServiceName) *svcEntry {
	e := t.svcs[name]
	if e == nil {
		e = &svcEntry{}
		t.svcs[name] = e
	}
	return e
}

// gc forgets the entry of a Service once nothing of it is left.
func (t *Tracker) gc(name model.ServiceName, e *svcEntry) {
	if len(e.ports) == 0 && len(e.slices) == 0 && len(e.epPorts) == 0 {
		delete(t.svcs, name)
	}
}

// smallPending is the pending-map size below which Apply clears a map
// rather than allocating a new one.
const smallPending = 64

// New returns an empty Tracker. It panics if cfg.Family is not a valid IP
// family, which is a programming error.
func New(cfg Config) *Tracker {
	if cfg.Family != model.IPv4 && cfg.Family != model.IPv6 {
		panic(fmt.Sprintf("changetracker: invalid IP family %v", cfg.Family))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Tracker{
		family:    cfg.Family,
		nodeName:  cfg.NodeName,
		proxyName: cfg.ServiceProxyName,
		log:       log,
		state: model.State{
			Family:    cfg.Family,
			Services:  make(map[model.ServicePortName]*model.ServicePort),
			Endpoints: make(map[model.ServicePortName][]*model.Endpoint),
		},
		svcs:         make(map[model.ServiceName]*svcEntry),
		svcPending:   make(map[model.ServiceName][]*model.ServicePort),
		slices:       make(map[sliceID]*sliceInfo),
		slicePending: make(map[sliceID]*sliceInfo),
	}
}

// State returns the tracker's current state, as of the last Apply. The
// caller must not modify its maps, which the next Apply updates in place
// (or, when they are empty, may replace); the values in them are
// immutable (see the package documentation).
func (t *Tracker) State() *model.State { return &t.state }

// Pending reports whether there are changes that Apply has not folded into
// the state yet. Changes that cancel out are not pending.
func (t *Tracker) Pending() bool {
	return len(t.svcPending) > 0 || len(t.slicePending) > 0
}

// Result says what an Apply changed.
type Result struct {
	// Changed names every service port whose ServicePort or endpoint list
	// changed, including ports that were removed. It is never nil.
	Changed map[model.ServicePortName]struct{}
	// OldServices holds, for every service port whose ServicePort was
	// replaced or removed, the ServicePort it had before Apply; a port
	// that did not exist before has no entry, and the map is nil when
	// there are none. It lets a caller clean up after a removed port
	// (e.g. flush the conntrack entries of its cluster IP) without
	// keeping its own copy of the state.
	OldServices map[model.ServicePortName]*model.ServicePort
	// StaleEndpoints lists the endpoints of UDP and SCTP service ports
	// that were serving before Apply and are not any more (removed, or no
	// longer serving). Conntrack entries towards them must be flushed.
	// Sorted by service port name, then endpoint.
	StaleEndpoints []StaleEndpoint
	// StaleServices lists the UDP and SCTP service ports that went from
	// no serving endpoint to at least one (conntrack may hold entries
	// that rejected earlier packets) or whose ServicePort was removed.
	// Sorted by name.
	StaleServices []model.ServicePortName
}

// StaleEndpoint is an endpoint of a connectionless service port whose
// conntrack entries may outlive it.
type StaleEndpoint struct {
	// Service is the service port the endpoint belonged to.
	Service model.ServicePortName
	// Endpoint is the endpoint's address and target port.
	Endpoint netip.AddrPort
}

// String returns "namespace/name:port/PROTOCOL -> ip:port".
func (s StaleEndpoint) String() string {
	return s.Service.String() + " -> " + s.Endpoint.String()
}

// String summarises r on one line, listing changed ports in sorted order.
func (r Result) String() string {
	names := make([]string, 0, len(r.Changed))
	for n := range r.Changed {
		names = append(names, n.String())
	}
	slices.Sort(names)
	stale := make([]string, len(r.StaleEndpoints))
	for i, s := range r.StaleEndpoints {
		stale[i] = s.String()
	}
	staleSvc := make([]string, len(r.StaleServices))
	for i, s := range r.StaleServices {
		staleSvc[i] = s.String()
	}
	return fmt.Sprintf("changed=[%s] staleEndpoints=[%s] staleServices=[%s]",
		strings.Join(names, " "), strings.Join(stale, " "), strings.Join(staleSvc, " "))
}

// Apply folds the pending changes into the state and reports what changed.
// Its cost is proportional to the pending changes.
func (t *Tracker) Apply() Result {
	// Most pending Services and slices change one service port each.
	hint := max(len(t.svcPending), len(t.slicePending))
	res := Result{Changed: make(map[model.ServicePortName]struct{}, hint)}
	t.presize()
	for name, ports := range t.svcPending {
		t.applyService(name, ports, &res)
	}
	if t.svcPeak > smallPending {
		t.svcPending = make(map[model.ServiceName][]*model.ServicePort)
	} else {
		clear(t.svcPending)
	}
	t.svcPeak = 0

	for id, info := range t.slicePending {
		t.applySlice(id, info)
	}
	if t.slicePeak > smallPending {
		t.slicePending = make(map[sliceID]*sliceInfo)
	} else {
		clear(t.slicePending)
	}
	t.slicePeak = 0
	slices.SortFunc(t.affected, func(a, b model.ServiceName) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	t.affected = slices.Compact(t.affected)
	for _, svc := range t.affected {
		t.applyEndpoints(svc, &res)
	}
	clear(t.affected)
	t.affected = t.affected[:0]

	res.StaleServices = slices.CompactFunc(
		slices.SortedFunc(slices.Values(res.StaleServices), comparePortName),
		func(a, b model.ServicePortName) bool { return a == b })
	slices.SortFunc(res.StaleEndpoints, func(a, b StaleEndpoint) int {
		return cmp.Or(comparePortName(a.Service, b.Service), a.Endpoint.Compare(b.Endpoint))
	})
	return res
}

// presize makes the maps Apply fills big enough for the pending changes
// when they are empty and many changes are pending: the first Apply after
// the initial lists. Growing a map to 100,000 entries moves every entry
// on the way (about a fifth of that Apply). An empty map is replaced,
// which the package documentation allows.
func (t *Tracker) presize() {
	nsvc, nslice := len(t.svcPending), len(t.slicePending)
	if nsvc > smallPending && len(t.state.Services) == 0 {
		t.state.Services = make(map[model.ServicePortName]*model.ServicePort, nsvc)
	}
	if nslice > smallPending && len(t.state.Endpoints) == 0 {
		t.state.Endpoints = make(map[model.ServicePortName][]*model.Endpoint, nslice)
	}
	if n := max(nsvc, nslice); n > smallPending && len(t.svcs) == 0 {
		t.svcs = make(map[model.ServiceName]*svcEntry, n)
	}
	if nslice > smallPending && len(t.slices) == 0 {
		t.slices = make(map[sliceID]*sliceInfo, nslice)
	}
}

// comparePortName orders service port names by namespace, name, port name
// and protocol.
func comparePortName(a, b model.ServicePortName) int { return a.Compare(b) }
