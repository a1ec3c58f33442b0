package ebpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// backend programs one IP family: its frontend, slot and node address
// maps, and the composed nftables table of the family.
type backend struct {
	cfg    Config
	family model.IPFamily
	dp     *dataplane
	codec  codec
	svcMap *ebpf.Map
	beMap  *ebpf.Map
	// nodeMap holds the node addresses node ports open on.
	nodeMap *ebpf.Map
	// magMap holds the Maglev tables of the groups that use one.
	magMap *ebpf.Map
	// rows builds, writes and reads the Maglev tables.
	rows *rowWriter
	// warned remembers the unknown schedulers logged (shared with the
	// other family's backend).
	warned *schedulerWarnings
	ns     *netns.NS
	nl     *netlink.Handle
	nft    proxier.Backend // nil with SocketOnly
	log    *slog.Logger
	ids    idAllocator
	// st is what the maps hold as of the last successful sync; nil when
	// unknown (before the first sync, after a failure or Cleanup).
	st *state
}

var _ proxier.Backend = (*backend)(nil)

// Name returns "ebpf".
func (b *backend) Name() string { return "ebpf" }

// Family returns the backend's IP family.
func (b *backend) Family() model.IPFamily { return b.family }

// state is the programmed state, kept in memory so that an incremental
// sync never reads the kernel.
type state struct {
	svcs map[model.ServicePortName]*svcState
	// owners maps each frontend to the service port holding it.
	owners map[feKey]model.ServicePortName
	// nodes are the node addresses in the node address map.
	nodes   map[netip.Addr]bool
	nfes    int
	nslots  int
	ntables int
	// noTable counts the service ports of the current sync whose groups
	// pick at random because MaxMaglevTables was reached.
	noTable int
	// order holds the service ports a full sync admitted, in the order
	// rendered, until fullOps has used them: a slice walks the states
	// in the order they were allocated, where the maps' order is
	// random (fullOps took a fifth of the user-space time of a first
	// sync of 100,000 services walking the maps).
	order []*svcState
}

func newState() *state { return newStateSized(0) }

// newStateSized returns an empty state whose maps have room for n
// service ports (with one frontend and one group each) without growing.
func newStateSized(n int) *state {
	return &state{
		svcs:   make(map[model.ServicePortName]*svcState, n),
		owners: make(map[feKey]model.ServicePortName, n),
		nodes:  map[netip.Addr]bool{},
	}
}

// admit adds s as name's state, unless one of its frontends belongs to
// another service port or a map would overflow.
func (st *state) admit(name model.ServicePortName, s *svcState, cfg *Config, fam model.IPFamily) error {
	for _, e := range s.fes {
		if o, ok := st.owners[e.key]; ok && o != name {
			return fmt.Errorf("%s is already used by %s", e.key, o)
		}
	}
	svcMap, beMap := mapSvc4, mapBe4
	if fam == model.IPv6 {
		svcMap, beMap = mapSvc6, mapBe6
	}
	if st.nfes+len(s.fes) > cfg.MaxServices {
		return &MapFullError{Map: svcMap, Field: "MaxServices", Size: cfg.MaxServices}
	}
	if st.nslots+s.slots() > cfg.MaxBackends {
		return &MapFullError{Map: beMap, Field: "MaxBackends", Size: cfg.MaxBackends}
	}
	if n := s.tables(); n > 0 && st.ntables+n > cfg.MaxMaglevTables {
		// Programmed with random selection rather than left out.
		for _, g := range s.groups {
			if g != nil {
				g.maglev = false
			}
		}
		st.noTable++
	}
	s.flagMaglev()
	for _, e := range s.fes {
		st.owners[e.key] = name
	}
	st.svcs[name] = s
	st.nfes += len(s.fes)
	st.nslots += s.slots()
	st.ntables += s.tables()
	return nil
}

// release removes name's state.
func (st *state) release(name model.ServicePortName) {
	s := st.svcs[name]
	if s == nil {
		return
	}
	for _, e := range s.fes {
		if st.owners[e.key] == name {
			delete(st.owners, e.key)
		}
	}
	st.nfes -= len(s.fes)
	st.nslots -= s.slots()
	st.ntables -= s.tables()
	delete(st.svcs, name)
}

// Sync makes the maps (and the nftables table) match req.
func (b *backend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.dp == nil {
		return errClosed
	}
	if req == nil || req.State == nil {
		return errors.New("ebpf: sync request without state")
	}
	if req.State.Family != 0 && req.State.Family != b.family {
		return fmt.Errorf("ebpf: %s backend got %s state", b.family, req.State.Family)
	}
	// A full render of the socket maps and of the tc plane takes the
	// service ports in name order: sorted once for both (100,000 names
	// took 40-90 ms of CPU each).
	sorted := sync.OnceValue(func() []namedPort { return sortedServices(req) })
	full := req.Full || b.st == nil
	var objErrs []error
	var err error
	if _, tc := b.nft.(*tcBackend); full && b.nft != nil && !tc {
		var nsErr error
		if nsErr, err = b.syncFullBeside(ctx, req, sorted()); nsErr != nil {
			if !proxier.OnlyObjectErrors(nsErr) {
				return fmt.Errorf("ebpf: north-south rules: %w", nsErr)
			}
			objErrs = append(objErrs, nsErr)
		}
	} else {
		if b.nft != nil {
			if err := syncNorthSouth(ctx, b.nft, req, sorted); err != nil {
				if !proxier.OnlyObjectErrors(err) {
					return fmt.Errorf("ebpf: north-south rules: %w", err)
				}
				objErrs = append(objErrs, err)
			}
		}
		if full {
			err = b.syncFull(req, sorted())
		} else {
			err = b.syncIncremental(req)
		}
	}
	if err != nil && !proxier.OnlyObjectErrors(err) {
		b.st = nil
		return err
	}
	objErrs = append(objErrs, err)
	if b.st != nil {
		b.dp.metrics.observe(b.family, b.st, &b.cfg)
	}
	if err := b.dp.markSynced(b.family); err != nil {
		return err
	}
	return errors.Join(objErrs...)
}

// syncNorthSouth syncs the north-south part nft; the tc plane takes the
// service ports in name order from sorted when it renders them all.
func syncNorthSouth(ctx context.Context, nft proxier.Backend, req *proxier.SyncRequest, sorted func() []namedPort) error {
	if t, ok := nft.(*tcBackend); ok {
		return t.syncSorted(ctx, req, sorted)
	}
	return nft.Sync(ctx, req)
}

// ops are the map writes of a sync, applied in an order that never lets
// a frontend point at a slot that is not (yet or any more) there.
type ops struct {
	putBeK []beKey
	putBeV []netip.AddrPort
	// putGroups are groups every slot of which is written (those a
	// full sync finds missing or incomplete): the codec encodes them
	// straight from the group, where listing a million slots in
	// putBeK and putBeV cost 40 MB at 100,000 services.
	putGroups []*group
	putSvcK   []feKey
	putSvcV   []svcVal
	delSvc    []feKey
	delBe     []beKey
	putNodes  []netip.Addr
	delNodes  []netip.Addr
	// Maglev tables: groups whose table is built and written, and
	// group ids whose table is deleted.
	putRows []*group
	delRows []uint32
}

func (o *ops) empty() bool {
	return len(o.putBeK)+len(o.putGroups)+len(o.putSvcK)+len(o.delSvc)+len(o.delBe)+len(o.putNodes)+len(o.delNodes)+
		len(o.putRows)+len(o.delRows) == 0
}

// putSlots counts the slots o writes.
func (o *ops) putSlots() int {
	n := len(o.putBeK)
	for _, g := range o.putGroups {
		n += len(g.eps)
	}
	return n
}

// apply writes o: new slots first, then the Maglev tables (pointing at
// slots), then frontends (pointing at both), then removed frontends,
// then the tables and slots no frontend uses any more. Node addresses
// are added before and removed after everything else.
func (b *backend) apply(o *ops) error {
	steps := []func() error{
		func() error { return b.codec.putNode(b.nodeMap, o.putNodes) },
		func() error { return b.codec.putBe(b.beMap, o.putBeK, o.putBeV, o.putGroups) },
		func() error { return b.rows.put(b.magMap, o.putRows) },
		func() error { return b.codec.putSvc(b.svcMap, o.putSvcK, o.putSvcV) },
		func() error { return b.codec.delSvc(b.svcMap, o.delSvc) },
		func() error { return batchDel(b.magMap, o.delRows) },
		func() error { return delBe(b.beMap, o.delBe) },
		func() error { return b.codec.delNode(b.nodeMap, o.delNodes) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("ebpf: %w", err)
		}
	}
	return nil
}

// syncFull converges the maps to req: it reads what they hold, renders
// the whole state (keeping the group ids and slot layouts of the state in
// memory, or, after a restart, those found in the maps) and writes the
// difference. ports are the service ports of req in name order
// (sortedServices).
func (b *backend) syncFull(req *proxier.SyncRequest, ports []namedPort) error {
	if err := b.dp.syncNetNS(); err != nil {
		return err
	}
	p, err := b.planFull(req, ports)
	if err != nil {
		return err
	}
	return b.applyFull(p)
}

// syncFullBeside is syncFull with the composed nftables table synced at
// the same time: the maps are read and the writes planned while the
// table is rendered (and, after a restart, adopted), the two parts
// being independent (a quarter each of a restarted process's first
// sync at 30,000 services). The maps are written only once the table
// synced without other than object errors, so that a table that fails
// leaves the maps (and the state in memory, which planning does not
// change) as they were, as in the sequential order. It returns the
// table's error (nsErr; the maps are not written unless it holds only
// object errors) and the maps' (err).
func (b *backend) syncFullBeside(ctx context.Context, req *proxier.SyncRequest, ports []namedPort) (nsErr, err error) {
	done := make(chan error, 1)
	go func() { done <- b.nft.Sync(ctx, req) }()
	p, err := b.planFull(req, ports)
	if nsErr = <-done; nsErr != nil && !proxier.OnlyObjectErrors(nsErr) {
		return nsErr, nil
	}
	if err != nil {
		return nsErr, err
	}
	if err := b.dp.syncNetNS(); err != nil {
		return nsErr, err
	}
	return nsErr, b.applyFull(p)
}

// fullPlan is what a full sync writes, planned before any write.
type fullPlan struct {
	st      *state
	o       *ops
	stale   []staleKey
	objErrs map[model.ServicePortName]error
	// read and render are the times the plan took to read the maps
	// and to render the state and its writes.
	read, render time.Duration
}

// planFull reads the maps and plans the writes that converge them to
// req, without writing.
func (b *backend) planFull(req *proxier.SyncRequest, ports []namedPort) (*fullPlan, error) {
	start := time.Now()
	k, err := b.readKernel(b.st == nil)
	if err != nil {
		return nil, err
	}
	if b.st == nil {
		b.ids.next = max(b.ids.next, maxID(k.svc, k.be)+1)
	}
	nodes, err := b.nodeAddrs()
	if err != nil {
		return nil, err
	}
	read := time.Now()
	st, objErrs := b.renderPorts(req, k, ports)
	o, err := b.fullOps(st, k, nodes)
	if err != nil {
		return nil, err
	}
	stale := b.fullStale(st, k, nodes)
	return &fullPlan{st: st, o: o, stale: stale, objErrs: objErrs, read: read.Sub(start), render: time.Since(read)}, nil
}

// applyFull writes p and makes its state the backend's.
func (b *backend) applyFull(p *fullPlan) error {
	start := time.Now()
	st, o := p.st, p.o
	if err := b.apply(o); err != nil {
		return err
	}
	b.st = st
	b.log.Info("full sync", "services", len(st.svcs), "frontends", st.nfes, "slots", st.nslots, "tables", st.ntables,
		"written", o.putSlots()+len(o.putSvcK)+len(o.putRows), "deleted", len(o.delBe)+len(o.delSvc)+len(o.delRows),
		"read", p.read, "render", p.render, "write", time.Since(start))
	b.warnNoTable(st)
	b.destroyStale(p.stale)
	return proxier.JoinObjectErrors(p.objErrs)
}

// kernelState is what a full sync reads from the maps.
type kernelState struct {
	svc   map[feKey]svcVal
	nodes map[netip.Addr]bool
	// be and groups hold the slots, read only without a state in
	// memory (to recover group ids and layouts); otherwise the slots
	// are compared as they stream in.
	be     map[beKey]netip.AddrPort
	groups map[uint32][]netip.AddrPort
}

func (b *backend) readKernel(withSlots bool) (*kernelState, error) {
	var k kernelState
	var err error
	if k.svc, err = b.codec.readSvc(b.svcMap); err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if k.nodes, err = b.codec.readNode(b.nodeMap); err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if withSlots {
		if k.be, err = b.codec.readBe(b.beMap); err != nil {
			return nil, fmt.Errorf("ebpf: %w", err)
		}
		k.groups = groupsOf(k.be)
	}
	return &k, nil
}

// renderAll renders every service port of req into a new state. Service
// ports that cannot be programmed are left out, with their errors.
func (b *backend) renderAll(req *proxier.SyncRequest, k *kernelState) (*state, map[model.ServicePortName]error) {
	return b.renderPorts(req, k, sortedServices(req))
}

// renderPorts is renderAll with the service ports of req in name order
// (sortedServices).
func (b *backend) renderPorts(req *proxier.SyncRequest, k *kernelState, ports []namedPort) (*state, map[model.ServicePortName]error) {
	old := b.st
	st := newStateSized(len(req.State.Services))
	st.order = make([]*svcState, 0, len(req.State.Services))
	errs := map[model.ServicePortName]error{}
	// After a restart, the groups of frontends found in the maps are
	// recovered, each by one service port (claimed); with empty maps
	// there is nothing to recover.
	recovering := old == nil && len(k.svc) > 0
	claimed := map[uint32]bool{}
	node := b.nodeRanges(req)
	for _, e := range ports {
		name, sp := e.name, e.sp
		var prev *svcState
		if old != nil {
			prev = old.svcs[name]
		} else if recovering {
			prev = recoverState(b.family, sp, k.svc, k.groups, claimed, node != nil)
		}
		s, err := renderRanged(b.family, sp, e.tg, prev, &b.ids, node)
		if err == nil {
			b.planTables(s, prev, b.selectionFor(sp))
			err = st.admit(name, s, &b.cfg, b.family)
		}
		if err != nil {
			errs[name] = err
			continue
		}
		st.order = append(st.order, s)
		if recovering {
			for _, g := range s.groups {
				if g != nil {
					claimed[g.id] = true
				}
			}
		}
	}
	b.warned.retain(b.family, func(name model.ServicePortName) bool {
		sp := req.State.Services[name]
		return sp != nil && unknownScheduler(sp)
	})
	return st, errs
}

// namedPort is a service port, its name and its targets (nil: none).
type namedPort struct {
	name model.ServicePortName
	sp   *model.ServicePort
	tg   *proxier.Targets
}

// sortedServices returns the service ports of req in name order, with
// their targets.
func sortedServices(req *proxier.SyncRequest) []namedPort {
	out := make([]namedPort, 0, len(req.State.Services))
	for name, sp := range req.State.Services {
		out = append(out, namedPort{name, sp, req.Targets[name]})
	}
	slices.SortFunc(out, func(a, b namedPort) int { return a.name.Compare(b.name) })
	return out
}

// fullOps returns the writes that turn the maps' contents k into st, and
// records the node addresses in st.
func (b *backend) fullOps(st *state, k *kernelState, nodes []netip.Addr) (*ops, error) {
	svcs := st.order
	if svcs == nil {
		svcs = slices.Collect(maps.Values(st.svcs))
	}
	st.order = nil
	o := &ops{}
	if len(k.svc) == 0 {
		o.putSvcK, o.putSvcV = make([]feKey, 0, st.nfes), make([]svcVal, 0, st.nfes)
	}
	for _, s := range svcs {
		for _, e := range s.fes {
			if h, ok := k.svc[e.key]; !ok || h != e.val {
				o.putSvcK, o.putSvcV = append(o.putSvcK, e.key), append(o.putSvcV, e.val)
			}
		}
	}
	for key := range k.svc {
		if _, ok := st.owners[key]; !ok {
			o.delSvc = append(o.delSvc, key)
		}
	}
	// A slot is wanted when its group is and it is below the group's
	// count; a wanted slot missing from the maps shows in the group's
	// found count, and the whole group is written again.
	eachGroup(svcs, func(g *group) { g.found = 0 })
	groupOf := groupIndex(svcs)
	checkSlot := func(key beKey, v netip.AddrPort) {
		g := groupOf(key.ID)
		if g == nil || int(key.Slot) >= len(g.eps) {
			o.delBe = append(o.delBe, key)
			return
		}
		g.found++
		if g.eps[key.Slot] != v {
			o.putBeK, o.putBeV = append(o.putBeK, key), append(o.putBeV, g.eps[key.Slot])
		}
	}
	if k.be != nil {
		for key, v := range k.be {
			checkSlot(key, v)
		}
	} else if err := b.codec.scanBe(b.beMap, checkSlot); err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	eachGroup(svcs, func(g *group) {
		if g.found < len(g.eps) {
			o.putGroups = append(o.putGroups, g)
		}
	})
	if err := b.fullTableOps(o, svcs, groupOf); err != nil {
		return nil, err
	}
	o.putNodes, o.delNodes = diffNodes(k.nodes, nodes)
	for _, a := range nodes {
		st.nodes[a] = true
	}
	return o, nil
}

// fullTableOps adds to o the Maglev rows that make the map match st: a
// row is compared with the fingerprint of the group's table when its
// endpoints did not change since the last sync, else with the table
// built for it (after a restart). Tables to write are built when they
// are written. svcs are the service ports of the state, groupOf finds
// their groups by id.
func (b *backend) fullTableOps(o *ops, svcs []*svcState, groupOf func(uint32) *group) error {
	eachGroup(svcs, func(g *group) { g.rowFound = false })
	var scratch []uint32
	err := b.rows.scan(b.magMap, func(id uint32, row []uint32) {
		g := groupOf(id)
		if g == nil || !g.maglev || g.rowFound {
			o.delRows = append(o.delRows, id)
			return
		}
		g.rowFound = true
		if !g.hasSum {
			scratch = maglevTable(g.eps, len(row), scratch)
			if !slices.Equal(scratch, row) {
				o.putRows = append(o.putRows, g)
				return
			}
			g.sum, g.hasSum = tableSum(b.rows.seed, row), true
			return
		}
		if tableSum(b.rows.seed, row) != g.sum {
			o.putRows = append(o.putRows, g)
		}
	})
	if err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	eachGroup(svcs, func(g *group) {
		if g.maglev && !g.rowFound {
			o.putRows = append(o.putRows, g)
		}
	})
	return nil
}

// groupIndex returns a function that finds the groups of svcs by id. It
// indexes them at its first call: a full sync into empty maps (a
// process's first) finds no slot or table to look up, and builds no
// index.
func groupIndex(svcs []*svcState) func(uint32) *group {
	var byID map[uint32]*group
	return func(id uint32) *group {
		if byID == nil {
			byID = make(map[uint32]*group, len(svcs))
			eachGroup(svcs, func(g *group) { byID[g.id] = g })
		}
		return byID[id]
	}
}

// eachGroup calls fn with every group of svcs.
func eachGroup(svcs []*svcState, fn func(*group)) {
	for _, s := range svcs {
		for _, g := range s.groups {
			if g != nil {
				fn(g)
			}
		}
	}
}

// warnNoTable logs the service ports that pick at random because the
// Maglev maps are full.
func (b *backend) warnNoTable(st *state) {
	if st.noTable > 0 {
		b.log.Warn("Maglev tables full: service ports pick endpoints at random; raise Config.MaxMaglevTables",
			"servicePorts", st.noTable, "tables", st.ntables, "max", b.cfg.MaxMaglevTables)
	}
	st.noTable = 0
}

// fullStale returns the (endpoint, service) pairs of UDP frontends that
// st drops: compared with the previous state, or after a restart with
// what the maps held.
func (b *backend) fullStale(st *state, k *kernelState, nodes []netip.Addr) []staleKey {
	if b.dp.destroy == nil {
		return nil
	}
	before := map[staleKey]bool{}
	if old := b.st; old != nil {
		for _, s := range old.svcs {
			udpPairs(s, keys(old.nodes), before)
		}
	} else {
		before = kernelPairs(k.svc, k.groups, keys(k.nodes))
	}
	after := map[staleKey]bool{}
	for _, s := range st.svcs {
		udpPairs(s, nodes, after)
	}
	return minus(before, after)
}

// syncIncremental writes the difference of the changed service ports,
// computed from the state in memory: the maps are not read.
func (b *backend) syncIncremental(req *proxier.SyncRequest) error {
	st := b.st
	st.noTable = 0
	names := slices.SortedFunc(maps.Keys(req.Changed), model.ServicePortName.Compare)
	old := map[model.ServicePortName]*svcState{}
	for _, name := range names {
		if s := st.svcs[name]; s != nil {
			old[name] = s
			st.release(name)
		}
	}
	nodes, err := b.nodeAddrs()
	if err != nil {
		return err
	}
	objErrs := map[model.ServicePortName]error{}
	o := &ops{}
	putSvc := map[feKey]bool{}
	var stale []staleKey
	node := b.nodeRanges(req)
	for _, name := range names {
		var s *svcState
		sp, ok := req.State.Services[name]
		if ok {
			var err error
			s, err = renderRanged(b.family, sp, req.Targets[name], old[name], &b.ids, node)
			if err == nil {
				b.planTables(s, old[name], b.selectionFor(sp))
				err = st.admit(name, s, &b.cfg, b.family)
			}
			if err != nil {
				objErrs[name] = err
				s = nil
			}
		}
		if !ok || !unknownScheduler(sp) {
			b.warned.forget(b.family, name)
		}
		diffService(o, old[name], s, putSvc)
		tableOps(o, old[name], s)
		if b.dp.destroy != nil && old[name] != nil {
			before, after := map[staleKey]bool{}, map[staleKey]bool{}
			udpPairs(old[name], keys(st.nodes), before)
			if s != nil {
				udpPairs(s, nodes, after)
			}
			stale = append(stale, minus(before, after)...)
		}
	}
	// A frontend moved from one service port to another is written by
	// the new owner, not deleted.
	o.delSvc = slices.DeleteFunc(o.delSvc, func(k feKey) bool { return putSvc[k] })
	o.putNodes, o.delNodes = diffNodes(st.nodes, nodes)
	if !o.empty() {
		if err := b.apply(o); err != nil {
			return err
		}
	}
	b.warnNoTable(st)
	clear(st.nodes)
	for _, a := range nodes {
		st.nodes[a] = true
	}
	b.destroyStale(stale)
	return proxier.JoinObjectErrors(objErrs)
}

// diffService adds to o what turns old into s (either may be nil), and
// records the frontends it writes in putSvc.
func diffService(o *ops, old, s *svcState, putSvc map[feKey]bool) {
	// Slot by slot: a group keeps its id and most of its slots
	// (layout), so comparing the slots of the group of the same id
	// finds the change without indexing every endpoint.
	if s != nil {
		for _, g := range s.groups {
			if g == nil {
				continue
			}
			prev := old.group(g.id)
			for i, ep := range g.eps {
				if i >= len(prev) || prev[i] != ep {
					o.putBeK, o.putBeV = append(o.putBeK, beKey{ID: g.id, Slot: uint32(i)}), append(o.putBeV, ep)
				}
			}
		}
	}
	if old != nil {
		for _, g := range old.groups {
			if g == nil {
				continue
			}
			for i := len(s.group(g.id)); i < len(g.eps); i++ {
				o.delBe = append(o.delBe, beKey{ID: g.id, Slot: uint32(i)})
			}
		}
	}
	if s != nil {
		for _, e := range s.fes {
			if old == nil {
				o.putSvcK, o.putSvcV = append(o.putSvcK, e.key), append(o.putSvcV, e.val)
			} else if ov, ok := old.fe(e.key); !ok || ov != e.val {
				o.putSvcK, o.putSvcV = append(o.putSvcK, e.key), append(o.putSvcV, e.val)
			}
			putSvc[e.key] = true
		}
	}
	if old != nil {
		for _, e := range old.fes {
			if s == nil {
				o.delSvc = append(o.delSvc, e.key)
			} else if _, ok := s.fe(e.key); !ok {
				o.delSvc = append(o.delSvc, e.key)
			}
		}
	}
}

// destroyStale destroys connected UDP sockets translated to endpoints
// that left their service. A failure is logged: the sockets then keep
// their endpoint, as without the kernel support.
func (b *backend) destroyStale(stale []staleKey) {
	if len(stale) == 0 {
		return
	}
	if err := b.dp.destroyStale(stale); err != nil {
		b.log.Warn("destroying UDP sockets of removed endpoints failed", "err", err)
		return
	}
	b.log.Debug("destroyed UDP sockets of removed endpoints", "pairs", len(stale))
}

// recoverState rebuilds the previous state of sp from the maps, after a
// restart: the groups its frontends point at, unless another service
// port claimed them already. ranged says load-balancer IPs with source
// ranges have (node-only) frontends; a node-only drop counts no slot of
// its group, so it recovers none.
func recoverState(f model.IPFamily, sp *model.ServicePort, have map[feKey]svcVal, groups map[uint32][]netip.AddrPort, claimed map[uint32]bool, ranged bool) *svcState {
	fes := frontends(f, sp, ranged)
	if len(fes) == 0 {
		return nil
	}
	s := &svcState{}
	found := false
	for role := range s.groups {
		for _, fe := range fes {
			if fe.external != (role == 1) && !(role == 0 && fe == fes[0]) {
				continue
			}
			v, ok := have[fe.key]
			if !ok || claimed[v.ID] || (fe.nodeOnly && v.Count == 0) {
				continue
			}
			eps := groups[v.ID]
			s.groups[role] = &group{id: v.ID, eps: eps[:min(len(eps), int(v.Count))]}
			found = true
			break
		}
	}
	if s.groups[0] != nil && s.groups[1] != nil && s.groups[0].id == s.groups[1].id {
		s.groups[1] = nil
	}
	if !found {
		return nil
	}
	return s
}

// groupsOf returns the slots of every group in have, in slot order, up to
// the first missing slot.
func groupsOf(have map[beKey]netip.AddrPort) map[uint32][]netip.AddrPort {
	count := map[uint32]int{}
	for k := range have {
		count[k.ID]++
	}
	out := make(map[uint32][]netip.AddrPort, len(count))
	for id, n := range count {
		var eps []netip.AddrPort
		for i := range n {
			ep, ok := have[beKey{ID: id, Slot: uint32(i)}]
			if !ok {
				break
			}
			eps = append(eps, ep)
		}
		out[id] = eps
	}
	return out
}

func maxID(svc map[feKey]svcVal, be map[beKey]netip.AddrPort) uint32 {
	var m uint32
	for _, v := range svc {
		m = max(m, v.ID)
	}
	for k := range be {
		m = max(m, k.ID)
	}
	return m
}

// udpPairs adds the (endpoint, frontend) pairs of s's UDP frontends to
// out; a node port counts on every node address.
func udpPairs(s *svcState, nodes []netip.Addr, out map[staleKey]bool) {
	for _, e := range s.fes {
		if e.key.proto != protoNumber(model.UDP) {
			continue
		}
		for _, g := range s.groups {
			if g != nil && g.id == e.val.ID {
				addPairs(e.key, g.eps, nodes, out)
			}
		}
	}
}

func addPairs(k feKey, eps []netip.AddrPort, nodes []netip.Addr, out map[staleKey]bool) {
	if k.proto != protoNumber(model.UDP) {
		return
	}
	addrs := []netip.Addr{k.addr}
	if k.addr.IsUnspecified() {
		addrs = nodes
	}
	for _, a := range addrs {
		for _, ep := range eps {
			out[staleKey{BeAddr: mapped16(ep.Addr()), BePort: be16(ep.Port()), SvcAddr: mapped16(a), SvcPort: be16(k.port)}] = true
		}
	}
}

// kernelPairs returns the UDP pairs the maps hold.
func kernelPairs(svc map[feKey]svcVal, groups map[uint32][]netip.AddrPort, nodes []netip.Addr) map[staleKey]bool {
	out := map[staleKey]bool{}
	for k, v := range svc {
		eps := groups[v.ID]
		addPairs(k, eps[:min(len(eps), int(v.Count))], nodes, out)
	}
	return out
}

func minus(a, b map[staleKey]bool) []staleKey {
	var out []staleKey
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	return out
}

func keys(m map[netip.Addr]bool) []netip.Addr { return slices.Collect(maps.Keys(m)) }

func diffNodes(have map[netip.Addr]bool, want []netip.Addr) (add, del []netip.Addr) {
	w := map[netip.Addr]bool{}
	for _, a := range want {
		w[a] = true
		if !have[a] {
			add = append(add, a)
		}
	}
	for a := range have {
		if !w[a] {
			del = append(del, a)
		}
	}
	return add, del
}
