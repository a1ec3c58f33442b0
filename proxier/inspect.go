package proxier

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxykit/proxykit/model"
)

// This file is the inspection seam: a Backend that implements [Inspector]
// reads back from the kernel what it programmed, as [Frontend]s, and
// [Engine.Inspect] sets that beside what the desired state asks for, per
// service port, in a [Report].

// Inspector is implemented by a [Backend] that can read back what it
// programmed. Inspect reads the kernel, not the backend's memory: it
// returns every frontend the backend's objects in the kernel hold, in
// any order, including those no service port asks for any more. The
// engine never calls it while Sync, Cleanup or Close run. Every backend
// of this module implements it.
type Inspector interface {
	Inspect(ctx context.Context) ([]Frontend, error)
}

// Frontend is one destination a dataplane serves (an address, protocol
// and port), with where it sends new connections.
type Frontend struct {
	// Addr is the destination address. The zero Addr stands for the
	// node port addresses: a node port the backend matches on every
	// address it opens node ports on, without naming them.
	Addr netip.Addr
	// Protocol and Port are the destination's.
	Protocol model.Protocol
	Port     uint16
	// Endpoints are the endpoints new connections from every source go
	// to.
	Endpoints []netip.AddrPort
	// SomeSources are endpoints only some sources reach. With
	// externalTrafficPolicy Local, connections from outside go to the
	// local endpoints and those of pods and the node itself to the
	// cluster's (kube-proxy's short circuit): the endpoints not in both
	// are here.
	SomeSources []netip.AddrPort
	// Verdict is what happens to new connections of sources that reach
	// no endpoint: "reject" (the service has no endpoint) or "drop"
	// (externalTrafficPolicy or internalTrafficPolicy Local without a
	// local endpoint); empty when every source reaches an endpoint.
	Verdict string
	// Affinity is set when clients stick to an endpoint (ClientIP
	// session affinity).
	Affinity bool
	// SourceRanges are the sources admitted to a load-balancer IP with
	// loadBalancerSourceRanges; nil admits every source.
	SourceRanges []netip.Prefix
	// Detail says where the backend holds the frontend, in its own
	// terms (a chain, a virtual server, a map slot), for people; it is
	// not compared.
	Detail string
}

// Key returns "addr proto/port", or "node-ports proto/port" for a node
// port of the zero Addr.
func (f Frontend) Key() string {
	a := "node-ports"
	if f.Addr.IsValid() {
		a = f.Addr.String()
	}
	return fmt.Sprintf("%s %s/%d", a, strings.ToLower(string(f.Protocol)), f.Port)
}

// Diff describes how got differs from f, the wanted frontend, ignoring
// the address (a node port may be read back per node address) and
// Detail, and the source ranges of a frontend no source gets through;
// it returns "" when they agree. Endpoints are compared as sets.
func (f Frontend) Diff(got Frontend) string {
	var d []string
	if s := addrsDiff(f.Endpoints, got.Endpoints); s != "" {
		d = append(d, "endpoints "+s)
	}
	if s := addrsDiff(f.SomeSources, got.SomeSources); s != "" {
		d = append(d, "some-sources endpoints "+s)
	}
	if f.Verdict != got.Verdict {
		d = append(d, fmt.Sprintf("verdict %q, want %q", got.Verdict, f.Verdict))
	}
	if f.Affinity != got.Affinity {
		d = append(d, fmt.Sprintf("affinity %t, want %t", got.Affinity, f.Affinity))
	}
	// Source ranges matter only where a source reaches an endpoint: a
	// dataplane that rejects or drops every source (kube-proxy's
	// iptables mode) need not hold them.
	if len(f.Endpoints)+len(f.SomeSources) > 0 && !samePrefixes(f.SourceRanges, got.SourceRanges) {
		d = append(d, fmt.Sprintf("source ranges %v, want %v", got.SourceRanges, f.SourceRanges))
	}
	return strings.Join(d, "; ")
}

// addrsDiff lists what got has more (+) and less (-) than want.
func addrsDiff(want, got []netip.AddrPort) string {
	var d []string
	for _, a := range got {
		if !slices.Contains(want, a) {
			d = append(d, "+"+a.String())
		}
	}
	for _, a := range want {
		if !slices.Contains(got, a) {
			d = append(d, "-"+a.String())
		}
	}
	return strings.Join(d, " ")
}

// samePrefixes reports whether a and b cover the same addresses.
func samePrefixes(a, b []netip.Prefix) bool {
	return slices.Equal(addrRanges(a), addrRanges(b))
}

// addrRanges returns the addresses ps cover as sorted, disjoint,
// non-adjacent ranges [first, last].
func addrRanges(ps []netip.Prefix) [][2]netip.Addr {
	var rs [][2]netip.Addr
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = p.Masked()
		last := p.Addr().AsSlice()
		for i := p.Bits(); i < len(last)*8; i++ {
			last[i/8] |= 1 << (7 - i%8)
		}
		l, _ := netip.AddrFromSlice(last)
		rs = append(rs, [2]netip.Addr{p.Addr(), l})
	}
	slices.SortFunc(rs, func(a, b [2]netip.Addr) int { return a[0].Compare(b[0]) })
	var out [][2]netip.Addr
	for _, r := range rs {
		if n := len(out); n > 0 {
			prev := &out[n-1]
			if next := prev[1].Next(); r[0].Compare(prev[1]) <= 0 || (next.IsValid() && next == r[0]) {
				if r[1].Compare(prev[1]) > 0 {
					prev[1] = r[1]
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// FrontendKind names what a frontend of a service port is.
type FrontendKind string

// The kinds of frontends, as Kubernetes names the fields.
const (
	KindClusterIP    FrontendKind = "ClusterIP"
	KindExternalIP   FrontendKind = "ExternalIP"
	KindLoadBalancer FrontendKind = "LoadBalancer"
	KindNodePort     FrontendKind = "NodePort"
)

// WantOptions are what [WantFrontends] needs to know of the node and the
// dataplane.
type WantOptions struct {
	// NodeIP is the node's primary address of the family: a
	// load-balancer IP's source ranges admit the load-balancer IPs
	// themselves when they hold it (kube-proxy's allowFromNode: the node
	// reaching the IP from the IP).
	NodeIP netip.Addr
	// NoShortCircuit says the dataplane sends pods and the node to the
	// local endpoints of the external addresses of a service with
	// externalTrafficPolicy Local, as it sends outside sources, instead
	// of to every endpoint (kube-proxy's ipvs mode; see
	// [WithoutShortCircuit]).
	NoShortCircuit bool
}

// WithoutShortCircuit is implemented by a Backend whose external
// addresses of a service with externalTrafficPolicy Local send every
// source, pods and the node included, to the local endpoints, as
// kube-proxy's ipvs mode does (one virtual server cannot tell sources
// apart). [Engine.Inspect] then wants that instead of the short circuit.
type WithoutShortCircuit interface {
	Backend
	// WithoutShortCircuit marks the backend; it does nothing.
	WithoutShortCircuit()
}

// WantFrontends returns the frontends of sp as a dataplane that follows
// kube-proxy programs them for targets t, each with its kind: the
// cluster IP with t.Internal, and the node port (zero Addr), external
// IPs and load-balancer IPs with t.External, plus, with
// externalTrafficPolicy Local, the short circuit for pods and the node
// (see [Frontend.SomeSources]) unless opts.NoShortCircuit.
func WantFrontends(sp *model.ServicePort, t *Targets, opts WantOptions) ([]FrontendKind, []Frontend) {
	var kinds []FrontendKind
	var out []Frontend
	add := func(k FrontendKind, f Frontend) {
		f.Protocol = sp.Protocol
		f.Affinity = sp.SessionAffinity
		kinds, out = append(kinds, k), append(out, f)
	}
	internal := model.DistinctAddrs(t.Internal, nil)
	if sp.ClusterIP.IsValid() {
		f := Frontend{Addr: sp.ClusterIP, Port: sp.Port, Endpoints: internal}
		f.Verdict = noEndpointVerdict(t, len(internal))
		add(KindClusterIP, f)
	}
	if !sp.ExternallyAccessible() {
		return kinds, out
	}
	ext := Frontend{Endpoints: model.DistinctAddrs(t.External, nil)}
	ext.Verdict = noEndpointVerdict(t, len(ext.Endpoints))
	if sp.ExternalLocal() && t.HasEndpoints && !opts.NoShortCircuit {
		ext.Endpoints, ext.SomeSources = SplitEndpoints(ext.Endpoints, model.DistinctAddrs(t.ShortCircuit(), nil))
	}
	if sp.NodePort != 0 {
		f := ext
		f.Port = sp.NodePort
		add(KindNodePort, f)
	}
	for _, a := range sp.ExternalIPs {
		f := ext
		f.Addr, f.Port = a, sp.Port
		add(KindExternalIP, f)
	}
	for _, a := range sp.LoadBalancerIPs {
		f := ext
		f.Addr, f.Port = a, sp.Port
		if len(sp.LoadBalancerSourceRanges) > 0 {
			f.SourceRanges = slices.Clone(sp.LoadBalancerSourceRanges)
			if sp.SourceRangesHold(opts.NodeIP) {
				for _, lb := range sp.LoadBalancerIPs {
					f.SourceRanges = append(f.SourceRanges, netip.PrefixFrom(lb, lb.BitLen()))
				}
			}
		}
		add(KindLoadBalancer, f)
	}
	return kinds, out
}

// noEndpointVerdict is what happens to the sources that reach none of n
// endpoints.
func noEndpointVerdict(t *Targets, n int) string {
	switch {
	case !t.HasEndpoints:
		return "reject"
	case n == 0:
		return "drop"
	}
	return ""
}

// Report is what [Engine.Inspect] found: per IP family, every service
// port's wanted frontends beside those read back from the kernel.
type Report struct {
	// Backend names the backend, e.g. "nftables".
	Backend string `json:"backend"`
	// Families holds one report per IP family the engine programs.
	Families []FamilyReport `json:"families"`
}

// FamilyReport is the [Report] of one IP family.
type FamilyReport struct {
	// Family is "IPv4" or "IPv6".
	Family string `json:"family"`
	// Error says why the kernel could not be read (then every frontend
	// shows as not read); empty when it was.
	Error string `json:"error,omitempty"`
	// Services are the service ports of the desired state, sorted by
	// name.
	Services []ServiceReport `json:"services"`
	// Unclaimed are frontends in the kernel that no service port of the
	// desired state asks for (left over, or of a rejected service
	// port), sorted by key.
	Unclaimed []FrontendJSON `json:"unclaimed,omitempty"`
}

// ServiceReport is one service port of a [FamilyReport].
type ServiceReport struct {
	// Service is "namespace/name:port/PROTOCOL".
	Service string `json:"service"`
	// InternalPolicy and ExternalPolicy are its traffic policies.
	InternalPolicy string `json:"internalTrafficPolicy"`
	ExternalPolicy string `json:"externalTrafficPolicy,omitempty"`
	// Affinity is its session affinity timeout, e.g. "3h0m0s"; empty
	// without ClientIP affinity.
	Affinity string `json:"sessionAffinity,omitempty"`
	// Error is why the last sync did not program it (an object error,
	// or a claim on what another service port owns); empty otherwise.
	Error string `json:"error,omitempty"`
	// Frontends are its frontends.
	Frontends []FrontendReport `json:"frontends"`
}

// FrontendReport is one frontend of a [ServiceReport]: what the desired
// state asks for and what the kernel holds.
type FrontendReport struct {
	// Kind is "ClusterIP", "NodePort", "ExternalIP" or "LoadBalancer".
	Kind FrontendKind `json:"kind"`
	// Want is the frontend as the desired state asks for it.
	Want FrontendJSON `json:"want"`
	// Got are the frontends read back for it from the kernel: one, or
	// one per node address for a node port that a backend programs per
	// address; none when it is not programmed.
	Got []FrontendJSON `json:"got"`
	// Diff says how Got differs from Want ("not programmed" when Got is
	// empty); empty when they agree or when nothing was read (Read).
	Diff string `json:"diff,omitempty"`
	// Read is false when the kernel was not read: a dry run, or a
	// backend without [Inspector], or a failed read.
	Read bool `json:"read"`
}

// FrontendJSON is a [Frontend] as a report shows it.
type FrontendJSON struct {
	// Frontend is "addr proto/port" (see [Frontend.Key]).
	Frontend     string   `json:"frontend"`
	Endpoints    []string `json:"endpoints"`
	SomeSources  []string `json:"someSources,omitempty"`
	Verdict      string   `json:"verdict,omitempty"`
	Affinity     bool     `json:"affinity,omitempty"`
	SourceRanges []string `json:"sourceRanges,omitempty"`
	Detail       string   `json:"detail,omitempty"`
}

// JSON returns f in a report's form, endpoints sorted.
func (f Frontend) JSON() FrontendJSON {
	return FrontendJSON{
		Frontend:     f.Key(),
		Endpoints:    sortedStrings(f.Endpoints),
		SomeSources:  sortedStrings(f.SomeSources),
		Verdict:      f.Verdict,
		Affinity:     f.Affinity,
		SourceRanges: sortedStrings(f.SourceRanges),
		Detail:       f.Detail,
	}
}

func sortedStrings[T fmt.Stringer](xs []T) []string {
	if len(xs) == 0 {
		return nil
	}
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	slices.Sort(out)
	return out
}

// ErrNoInspector is the error of a [FamilyReport] whose backend does not
// implement [Inspector].
var ErrNoInspector = errors.New("the backend cannot read back what it programmed")

// ErrClosed is returned by [Engine.Inspect] after Close.
var ErrClosed = errors.New("proxier: closed")

// ErrNotSynced is returned by [Engine.Plan] until both the initial
// Services and EndpointSlices have been delivered: a plan before that
// would show services without their endpoints.
var ErrNotSynced = errors.New("proxier: the initial Services and EndpointSlices have not been delivered yet")

// Reporter is a Proxier that reports what it programmed and what it
// would program: the [Engine] every backend package returns.
type Reporter interface {
	// Inspect: see [Engine.Inspect].
	Inspect(ctx context.Context) (*Report, error)
	// Plan: see [Engine.Plan].
	Plan(ctx context.Context) (*Report, error)
}

var _ Reporter = (*Engine)(nil)

// Inspect reports, per IP family, every service port of the desired state
// with its frontends: what they should be, as [WantFrontends] computes
// them from the targets of the last sync, and what each backend reads
// back from the kernel ([Inspector]), with their differences; then the
// frontends in the kernel that nothing asks for. It waits for a running
// sync to finish and holds the next one back while it reads, so the
// kernel is read between syncs. Before the first sync, the desired state
// is empty.
func (e *Engine) Inspect(ctx context.Context) (*Report, error) {
	return e.inspect(ctx, true)
}

// Plan is [Engine.Inspect] without reading the kernel: every frontend's
// Want, as the next sync programs it (a dry run). It computes the
// targets for the current state itself, so it needs no sync and changes
// nothing in the kernel. It fails with [ErrNotSynced] until the initial
// Services and EndpointSlices have been delivered.
func (e *Engine) Plan(ctx context.Context) (*Report, error) {
	return e.inspect(ctx, false)
}

func (e *Engine) inspect(ctx context.Context, read bool) (*Report, error) {
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	e.mu.Lock()
	closed, topo, allIPs := e.closed, e.topo, e.nodeIPs
	synced := e.servicesSynced && e.slicesSynced
	e.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if !read && !synced {
		return nil, ErrNotSynced
	}
	r := &Report{Backend: e.families[0].backend.Name()}
	for _, f := range e.families {
		targets := f.targets
		if !read {
			// What the next sync would program: the pending changes
			// applied, as a sync does (it then finds them in
			// f.changed), and the targets computed afresh.
			e.mu.Lock()
			res := f.tracker.Apply()
			e.mu.Unlock()
			maps.Copy(f.changed, res.Changed)
			state := f.tracker.State()
			flipped, _ := f.owners.update(state.Services, slices.Collect(maps.Keys(state.Services)))
			for _, name := range flipped {
				f.changed[name] = struct{}{}
			}
			targets = make(map[model.ServicePortName]*Targets, len(state.Services))
			for name, sp := range state.Services {
				targets[name] = SelectTargets(sp, state.Endpoints[name], topo)
			}
		}
		opts := WantOptions{NodeIP: PrimaryNodeIP(e.cfg, &SyncRequest{NodeIPs: allIPs}, f.backend.Family())}
		_, opts.NoShortCircuit = f.backend.(WithoutShortCircuit)
		skipped := maps.Clone(f.objErrs)
		maps.Copy(skipped, f.owners.rejected)
		fr := FamilyReport{Family: f.backend.Family().String()}
		var got []Frontend
		if read {
			if in, ok := f.backend.(Inspector); !ok {
				fr.Error = ErrNoInspector.Error()
			} else if fs, err := in.Inspect(ctx); err != nil {
				fr.Error = err.Error()
			} else {
				got = fs
			}
		}
		fr.Services, fr.Unclaimed = joinFrontends(f.view().Services, targets, opts, skipped, got, read && fr.Error == "")
		r.Families = append(r.Families, fr)
	}
	return r, nil
}

// joinFrontends builds the service reports of one family: each wanted
// frontend with the read ones that match it; the read ones nothing
// matched are returned apart.
func joinFrontends(services map[model.ServicePortName]*model.ServicePort, targets map[model.ServicePortName]*Targets,
	opts WantOptions, skipped map[model.ServicePortName]error, got []Frontend, read bool) ([]ServiceReport, []FrontendJSON) {
	// Index what was read: by address, protocol and port, and node ports
	// (zero Addr) by protocol and port.
	type key struct {
		addr  netip.Addr
		proto model.Protocol
		port  uint16
	}
	byKey := map[key][]int{}
	for i, g := range got {
		k := key{g.Addr, g.Protocol, g.Port}
		byKey[k] = append(byKey[k], i)
	}
	// A node port read per node address: a frontend on an address no
	// cluster, external or load-balancer IP of its protocol and port
	// claims.
	addrClaimed := map[key]bool{}
	for _, sp := range services {
		for _, a := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
			addrClaimed[key{a, sp.Protocol, sp.Port}] = true
		}
	}
	perAddr := map[key][]int{} // by protocol and port
	for k, is := range byKey {
		if k.addr.IsValid() && !addrClaimed[k] {
			pk := key{proto: k.proto, port: k.port}
			perAddr[pk] = append(perAddr[pk], is...)
		}
	}
	used := make([]bool, len(got))
	names := slices.SortedFunc(maps.Keys(services), model.ServicePortName.Compare)
	for name := range skipped {
		if _, ok := services[name]; !ok {
			names = append(names, name)
		}
	}
	out := make([]ServiceReport, 0, len(names))
	for _, name := range names {
		sr := ServiceReport{Service: name.String()}
		if err := skipped[name]; err != nil {
			sr.Error = err.Error()
		}
		sp := services[name]
		t := targets[name]
		if sp == nil || t == nil {
			if sr.Error == "" {
				sr.Error = "not programmed"
			}
			out = append(out, sr)
			continue
		}
		sr.InternalPolicy = string(sp.InternalPolicy)
		if sp.ExternallyAccessible() {
			sr.ExternalPolicy = string(sp.ExternalPolicy)
		}
		if sp.SessionAffinity {
			sr.Affinity = sp.AffinityTimeout.String()
		}
		kinds, wants := WantFrontends(sp, t, opts)
		for i, w := range wants {
			fr := FrontendReport{Kind: kinds[i], Want: w.JSON(), Read: read}
			var idx []int
			if kinds[i] == KindNodePort {
				// Programmed for the node port addresses as a whole,
				// or per address.
				idx = append(slices.Clone(byKey[key{netip.Addr{}, w.Protocol, w.Port}]), perAddr[key{proto: w.Protocol, port: w.Port}]...)
				slices.Sort(idx)
			} else {
				idx = byKey[key{w.Addr, w.Protocol, w.Port}]
			}
			var diffs []string
			for _, j := range idx {
				used[j] = true
				fr.Got = append(fr.Got, got[j].JSON())
				if d := w.Diff(got[j]); d != "" {
					if len(idx) > 1 {
						d = got[j].Key() + ": " + d
					}
					diffs = append(diffs, d)
				}
			}
			if read && len(idx) == 0 {
				diffs = append(diffs, "not programmed")
			}
			fr.Diff = strings.Join(diffs, "; ")
			sr.Frontends = append(sr.Frontends, fr)
		}
		out = append(out, sr)
	}
	var unclaimed []FrontendJSON
	for i, g := range got {
		if !used[i] {
			unclaimed = append(unclaimed, g.JSON())
		}
	}
	slices.SortFunc(unclaimed, func(a, b FrontendJSON) int { return cmp.Compare(a.Frontend, b.Frontend) })
	return out, unclaimed
}

// planBackend is the Backend of [NewPlanner]: it programs nothing.
type planBackend struct {
	name   string
	family model.IPFamily
}

func (b planBackend) Name() string                             { return b.name }
func (b planBackend) Family() model.IPFamily                   { return b.family }
func (b planBackend) Sync(context.Context, *SyncRequest) error { return nil }
func (b planBackend) Cleanup(context.Context) error            { return nil }
func (b planBackend) Close() error                             { return nil }

// NewPlanner returns an engine for a dry run: fed like any proxier, it
// computes what the backend named name would be asked to program
// ([Engine.Plan]) and programs nothing, whether it runs or not. It opens
// no health check server and cleans no conntrack entry.
func NewPlanner(cfg Config, name string) (*Engine, error) {
	cfg.NoServiceHealthChecks = true
	cfg.NoConntrackCleanup = true
	return NewPerFamily(cfg, func(f model.IPFamily) (Backend, error) { return planBackend{name: name, family: f}, nil })
}

// WriteText writes the report for people: per family, each service port
// with its policies, then its frontends, each with its endpoints and,
// when the kernel was read and differs, what differs.
func (r *Report) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "backend %s\n", r.Backend)
	for _, fr := range r.Families {
		fmt.Fprintf(bw, "\n%s: %d service ports\n", fr.Family, len(fr.Services))
		if fr.Error != "" {
			fmt.Fprintf(bw, "  not read from the kernel: %s\n", fr.Error)
		}
		for _, sr := range fr.Services {
			fmt.Fprintf(bw, "  %s", sr.Service)
			if sr.InternalPolicy != "" {
				fmt.Fprintf(bw, "  internal=%s", sr.InternalPolicy)
			}
			if sr.ExternalPolicy != "" {
				fmt.Fprintf(bw, " external=%s", sr.ExternalPolicy)
			}
			if sr.Affinity != "" {
				fmt.Fprintf(bw, " affinity=%s", sr.Affinity)
			}
			bw.WriteString("\n")
			if sr.Error != "" {
				fmt.Fprintf(bw, "    ERROR %s\n", sr.Error)
			}
			for _, f := range sr.Frontends {
				fmt.Fprintf(bw, "    %-12s %s\n", f.Kind, f.Want)
				if f.Diff != "" {
					fmt.Fprintf(bw, "    %-12s DIFFERS: %s\n", "", f.Diff)
					for _, g := range f.Got {
						fmt.Fprintf(bw, "    %-12s kernel: %s\n", "", g)
					}
				}
			}
		}
		if len(fr.Unclaimed) > 0 {
			fmt.Fprintf(bw, "  in the kernel, claimed by no service port:\n")
			for _, u := range fr.Unclaimed {
				fmt.Fprintf(bw, "    %s\n", u)
			}
		}
	}
	return bw.Flush()
}

// String returns the frontend in one line: its key, source ranges and
// affinity, then its endpoints, those only some sources reach, the
// verdict and the detail.
func (f FrontendJSON) String() string {
	parts := []string{f.Frontend}
	if len(f.SourceRanges) > 0 {
		parts = append(parts, "from "+strings.Join(f.SourceRanges, ","))
	}
	if f.Affinity {
		parts = append(parts, "sticky")
	}
	parts = append(parts, "->")
	parts = append(parts, f.Endpoints...)
	if len(f.SomeSources) > 0 {
		parts = append(parts, "some sources: "+strings.Join(f.SomeSources, " "))
	}
	switch {
	case f.Verdict != "" && len(parts) > 0 && parts[len(parts)-1] == "->":
		parts = append(parts, f.Verdict)
	case f.Verdict != "":
		parts = append(parts, f.Verdict+" (other sources)")
	case parts[len(parts)-1] == "->":
		parts = append(parts, "(nothing)")
	}
	if f.Detail != "" {
		parts = append(parts, " ["+f.Detail+"]")
	}
	return strings.Join(parts, " ")
}

// SplitEndpoints returns the endpoints both a and b hold (every source
// reaches them, as [Frontend.Endpoints]) and those only one of them
// holds (some sources do, as [Frontend.SomeSources]): a's first, in
// their order.
func SplitEndpoints(a, b []netip.AddrPort) (every, some []netip.AddrPort) {
	for _, e := range a {
		if slices.Contains(b, e) {
			every = append(every, e)
		} else {
			some = append(some, e)
		}
	}
	for _, e := range b {
		if !slices.Contains(a, e) {
			some = append(some, e)
		}
	}
	return every, some
}
