package nftables

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// backend programs one IP family of one network namespace.
type backend struct {
	cfg  Config
	fi   familyInfo
	r    *renderer
	ns   *netns.NS
	lock *ownerlock.Lock // this table in this namespace is ours
	conn *conn
	log  *slog.Logger
	// st is what the kernel holds as of the last successful sync; nil
	// when unknown (before the first sync, after Cleanup).
	st *state
	// last describes the last successful sync (benchmarks report it).
	last syncStats
	// metrics counts failed syncs.
	metrics *syncMetrics
	// hairpinUnit rounds the size of the hairpin set (see hairpinSize);
	// 0 means defaultHairpinUnit. Tests lower it.
	hairpinUnit int
}

// syncStats describes one sync.
type syncStats struct {
	full bool
	// adopted is set when a first full sync found the table holding
	// what it would write, and wrote nothing.
	adopted         bool
	render, kernel  time.Duration // building the batch; the kernel's commit
	messages, bytes int
	// elems counts the set elements the transaction added or deleted.
	elems    int
	services int
}

var _ proxier.Backend = (*backend)(nil)

// Name returns "nftables".
func (b *backend) Name() string { return "nftables" }

// Family returns the backend's IP family.
func (b *backend) Family() model.IPFamily { return b.fi.fam }

// state is the programmed state, kept in memory so that an incremental
// sync never reads the kernel.
type state struct {
	services map[model.ServicePortName]*svcState
	// nextID is the lowest service port id never used; free holds ids
	// below it that are unused, oldest first. Ids are reused (they
	// must stay below maxServiceID), but an incremental sync never
	// reuses an id it frees.
	nextID uint32
	free   []uint32
	// nextAID is the next affinity id. Affinity ids are never reused.
	nextAID uint32
	// refs counts the users of each element of a refcounted set.
	refs refCounts
	// owners maps the dispatch keys (addresses, node ports, firewall
	// keys) to the service port that holds them.
	owners map[string]map[string]model.ServicePortName
	// serviceCIDRs are the service ranges the table holds (a change
	// makes the next sync a full one).
	serviceCIDRs []netip.Prefix
	// objects counts the users of the shard objects the table holds.
	objects objectCounts
	// noTable is set when the table does not exist because nothing
	// needs it (see wantTable).
	noTable bool
	// fingerprint is the fingerprint chain the table holds, naming the
	// hash of what the last full sync wrote (see fingerprint.go); empty
	// once an incremental sync changed the table.
	fingerprint string
	// hairpinSize is the size of the table's hairpin set (0: none, a
	// resizable hash table).
	hairpinSize uint32
}

type svcState struct {
	id   uint32
	objs *svcObjs
}

func newState() *state {
	return &state{
		services: map[model.ServicePortName]*svcState{},
		nextID:   1,
		nextAID:  1,
		refs:     refCounts{},
		owners:   map[string]map[string]model.ServicePortName{},
		objects:  objectCounts{},
	}
}

// ownerSpace groups sets whose keys must have one owner: an address and
// port is either dispatched or rejected, by one service port.
func ownerSpace(set string) string {
	switch set {
	case setServiceIPs, setNoEndpointIPs:
		return "ip"
	case setServiceNodePorts, setNoEndpointPorts:
		return "nodeport"
	case setFirewallIPs:
		return "firewall"
	}
	return ""
}

// ownedKeys calls f with the space, key and set of each key o must hold
// alone: its keys in owner spaces and the prefixes of its range sets. It
// stops when f returns false.
func (o *svcObjs) ownedKeys(f func(space, key, set string) bool) {
	for i := range o.fixed {
		e := &o.fixed[i]
		if sp := ownerSpace(e.set); sp != "" && !f(sp, e.id(), e.set) {
			return
		}
	}
	for _, r := range o.ranges {
		if !f(prefixSpace(r.set), string(r.prefix), r.set) {
			return
		}
	}
}

// refCounts counts the users of the elements of the refcounted sets, by
// set and by the address an element is made of (see familyInfo.refKey):
// addresses, not keys, spare a string per element.
type refCounts map[string]map[netip.Addr]int

// eachRef calls f with the set and address of each of o's elements of
// refcounted sets (hairpin and cluster-ips).
func (o *svcObjs) eachRef(f func(set string, a netip.Addr)) {
	for _, e := range o.fixed {
		if refcounted(e.set) {
			f(e.set, refAddr(e.e.Key))
		}
	}
	for _, slots := range o.slots {
		for _, ep := range slots {
			f(setHairpin, ep.Addr())
		}
	}
}

// refAddr returns the address of a cluster-ips key.
func refAddr(key []byte) netip.Addr {
	a, _ := netip.AddrFromSlice(key)
	return a
}

// refKey appends the key of a's element of refcounted set to buf: the
// address twice for hairpin, else the address.
func (fi *familyInfo) refKey(buf []byte, set string, a netip.Addr) []byte {
	if set == setHairpin {
		return hairpinKey(buf, a)
	}
	return append(buf, fi.Addr(a)...)
}

// hairpinKey appends the hairpin element of an endpoint address to buf:
// the address twice.
func hairpinKey(buf []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(append(buf, v[:]...), v[:]...)
	}
	v := a.As16()
	return append(append(buf, v[:]...), v[:]...)
}

// prefixSpace is the owner space of the range set prefixes of an
// endpoint map: its shard's (see shardOfMap).
func prefixSpace(set string) string { return "prefix " + shardOfMap(set) }

// Sync makes the kernel match req in one transaction.
func (b *backend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	err := b.sync(ctx, req)
	if err != nil && !proxier.OnlyObjectErrors(err) && ctx.Err() == nil && b.metrics != nil {
		b.metrics.failures.Inc()
	}
	return err
}

func (b *backend) sync(ctx context.Context, req *proxier.SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if req == nil || req.State == nil {
		return errors.New("nftables: sync request without state")
	}
	if req.State.Family != 0 && req.State.Family != b.fi.fam {
		return fmt.Errorf("nftables: %s backend got %s state", b.fi.fam, req.State.Family)
	}
	nodeIP := proxier.PrimaryNodeIP(b.cfg.Config, req, b.fi.fam)
	if nodeIP != b.r.nodeIP {
		// Source ranges depend on it; a change is rare.
		b.r.nodeIP = nodeIP
		return b.syncFull(ctx, req)
	}
	want := b.wantTable(req)
	if !want && !req.Full && b.st != nil && b.st.noTable {
		return nil // still nothing to program
	}
	if req.Full || b.st == nil || b.st.noTable == want || !slices.Equal(req.ServiceCIDRs, b.st.serviceCIDRs) {
		return b.syncFull(ctx, req)
	}
	return b.syncIncremental(ctx, req)
}

// wantTable reports whether the family needs a table: for a service
// port, or to drop traffic to the unallocated addresses of a service
// range. A node without IPv6 services has no ip6 table to read.
func (b *backend) wantTable(req *proxier.SyncRequest) bool {
	return len(req.State.Services) > 0 || len(normalizeRanges(b.fi.fam, req.ServiceCIDRs)) > 0
}

// syncNoTable makes sure the table does not exist, when nothing needs it.
// Deleting it loses nothing: it served no service port.
func (b *backend) syncNoTable(ctx context.Context, req *proxier.SyncRequest) error {
	exists, err := b.conn.TableExists(ctx, b.fi.proto, b.cfg.TableName)
	if err != nil {
		return fmt.Errorf("nftables: check table: %w", err)
	}
	if exists {
		tx := nftnl.NewBatch(b.fi.proto, b.cfg.TableName)
		tx.DelTable()
		if err := b.conn.Commit(ctx, tx); err != nil {
			return fmt.Errorf("nftables: delete the unused table: %w", notApplied(err))
		}
		b.log.Info("deleted the table: no service port or service range of the family")
	}
	st := newState()
	st.serviceCIDRs = slices.Clone(req.ServiceCIDRs)
	st.noTable = true
	b.st = st
	b.last = syncStats{full: true}
	return nil
}

// maxRetries bounds how often a sync drops service ports the kernel
// rejected and tries again.
const maxRetries = 3

// syncFull converges the whole table in one transaction. It never
// deletes a table that exists: it flushes every chain and set and fills
// them again, deleting the chains no service port needs, so that no
// packet meets a moment without rules. With a known state it keeps the
// affinity maps, so clients stay pinned. A first sync of this process
// (b.st nil) takes over a table an earlier process left the same way,
// with the chains the kernel lists; only when the kernel refuses that
// (an earlier version's table that differs in its definitions) is the
// table deleted and created again in the same transaction.
func (b *backend) syncFull(ctx context.Context, req *proxier.SyncRequest) error {
	if !b.wantTable(req) {
		return b.syncNoTable(ctx, req)
	}
	start := time.Now()
	mode := fullInPlace
	var stale, staleSets []string
	if b.st == nil || b.st.noTable {
		chains, exists, err := b.conn.Chains(ctx, b.fi.proto, b.cfg.TableName)
		if err != nil {
			return fmt.Errorf("nftables: list chains of table %s: %w", b.cfg.TableName, err)
		}
		mode, stale = fullCreate, nil
		if exists {
			mode, stale = fullTakeOver, staleOrder(chains)
			if staleSets, err = b.conn.Sets(ctx, b.fi.proto, b.cfg.TableName); err != nil {
				return fmt.Errorf("nftables: list sets of table %s: %w", b.cfg.TableName, err)
			}
		}
	} else {
		exists, err := b.conn.TableExists(ctx, b.fi.proto, b.cfg.TableName)
		if err != nil {
			return fmt.Errorf("nftables: check table: %w", err)
		}
		if !exists {
			b.log.Warn("table was deleted behind our back; recreating it")
			mode = fullCreate
		} else {
			stale, staleSets = b.st.chainNames(), b.st.setNames()
			if b.st.fingerprint != "" {
				stale = append(stale, b.st.fingerprint)
			}
		}
	}
	skip := map[model.ServicePortName]error{}
	for attempt := 0; ; attempt++ {
		st, objErrs := b.buildFull(req, mode != fullInPlace, skip)
		// After a failure nobody claimed, send each service port's
		// elements in messages of their own, so the next failure names
		// the service port.
		f, err := b.fullBatch(st, mode, stale, staleSets, attempt > 0)
		if err != nil {
			return err
		}
		tx := f.tx
		built := time.Now()
		if mode == fullTakeOver && attempt == 0 && f.holds(stale, staleSets) {
			// The kernel holds what tx would write: adopt it.
			st.fingerprint, st.hairpinSize = f.fingerprint, f.hairpinSize
			b.st = st
			b.last = syncStats{full: true, adopted: true, render: built.Sub(start), services: len(st.services)}
			b.log.Info("full sync", "services", len(st.services), "messages", 0, "bytes", 0,
				"mode", "adopt", "render", built.Sub(start), "kernel", time.Duration(0))
			return proxier.JoinObjectErrors(objErrs, skip)
		}
		err = b.conn.Commit(ctx, tx)
		if err == nil {
			st.fingerprint, st.hairpinSize = f.fingerprint, f.hairpinSize
			b.st = st
			b.last = syncStats{full: true, render: built.Sub(start), kernel: time.Since(built),
				messages: tx.Len(), bytes: tx.Size(), elems: tx.Elems(), services: len(st.services)}
			b.log.Info("full sync", "services", len(st.services), "messages", tx.Len(), "bytes", tx.Size(),
				"mode", mode.String(), "render", built.Sub(start), "kernel", time.Since(built))
			return proxier.JoinObjectErrors(objErrs, skip)
		}
		if mode == fullTakeOver && !b.dropRejected(err, skip) {
			b.log.Warn("kernel refused to take the table over in place; replacing it", "err", err)
			mode, stale, staleSets = fullReplace, nil, nil
			continue
		}
		if !b.dropRejected(err, skip) || attempt >= maxRetries {
			return fmt.Errorf("nftables: full sync: %w", notApplied(err))
		}
	}
}

// fullMode is how a full sync treats the table it finds.
type fullMode int

const (
	// fullInPlace flushes and refills the table this process filled,
	// keeping the affinity maps.
	fullInPlace fullMode = iota
	// fullTakeOver flushes and refills a table an earlier process
	// filled, affinity maps included (their ids are that process's).
	fullTakeOver
	// fullCreate creates the table, which does not exist.
	fullCreate
	// fullReplace deletes the table and creates it again, in the
	// transaction that fills it: the fallback when taking over fails.
	fullReplace
)

func (m fullMode) String() string {
	return [...]string{"in place", "take over", "create", "replace"}[m]
}

// staleOrder orders chain names for deletion: service chains are
// reached from external chains, and shared chains from both, so each is
// deleted after the chains that jump to it.
func staleOrder(chains []string) []string {
	rank := func(c string) int {
		switch {
		case strings.HasPrefix(c, "ext-"):
			return 0
		case strings.HasPrefix(c, "svc-"):
			return 1
		}
		return 2
	}
	out := slices.Clone(chains)
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	return out
}

// buildFull renders every service port of req into a new state. Service
// ports in skip are left out.
func (b *backend) buildFull(req *proxier.SyncRequest, recreate bool, skip map[model.ServicePortName]error) (*state, map[model.ServicePortName]error) {
	st := newState()
	st.serviceCIDRs = slices.Clone(req.ServiceCIDRs)
	old := b.st
	if recreate || old == nil || old.noTable {
		old = newState()
	} else {
		st.nextID = old.nextID
	}
	errs := map[model.ServicePortName]error{}
	names := sortedNames(req.State.Services)
	// Service ports that stay keep their ids; the others are free.
	used := map[uint32]bool{}
	for _, name := range names {
		if o := old.services[name]; o != nil {
			if _, ok := skip[name]; !ok {
				used[o.id] = true
			}
		}
	}
	for id := uint32(1); id < st.nextID; id++ {
		if !used[id] {
			st.free = append(st.free, id)
		}
	}
	st.nextAID = max(st.nextAID, old.nextAID)
	// Sized for every endpoint, to spare rehashing (the external list
	// is most often the internal one).
	eps := 0
	for _, t := range req.Targets {
		if t != nil {
			eps += len(t.Internal)
			if !sameList(t.External, t.Internal) {
				eps += len(t.External)
			}
		}
	}
	st.refs[setHairpin] = make(map[netip.Addr]int, eps)
	st.refs[setClusterIPs] = make(map[netip.Addr]int, len(req.State.Services))
	newAID := func() uint32 { st.nextAID++; return st.nextAID - 1 }
	for _, name := range names {
		if _, ok := skip[name]; ok {
			continue
		}
		var id uint32
		var prev *svcObjs
		if o := old.services[name]; o != nil {
			id, prev = o.id, o.objs
		} else {
			id = st.allocID()
		}
		objs, err := b.r.service(name, req.State.Services[name], req.Targets[name], svcAlloc{id: id, prev: prev, newAID: newAID, taken: st.taken(name)})
		if err == nil {
			err = st.claim(name, objs, nil)
		}
		if err != nil {
			errs[name] = err
			if prev == nil {
				st.free = append(st.free, id)
			}
			continue
		}
		st.services[name] = &svcState{id: id, objs: objs}
		st.use(objs, +1)
		st.objects.add(objs, +1)
	}
	return st, errs
}

// defaultHairpinUnit rounds the size of the hairpin set.
const defaultHairpinUnit = 1 << 16

// hairpinSize returns the size of a hairpin set of n elements: none (0,
// a resizable hash table) below a quarter of the unit (16,384), else n
// and half as many again, rounded up to a multiple of the unit
// (65,536). With a size the kernel
// picks a hash table of fixed buckets (nft_hash); without, an rhashtable
// (nft_rhash), whose inserts took a third of the kernel's commit of a
// million hairpin elements (rhashtable_insert_slow, growing it while
// filling it). The size also bounds the set: an incremental sync that
// would go beyond it is made a full one, which sizes the set again.
func (b *backend) hairpinSize(n int) uint32 {
	unit := b.hairpinUnit
	if unit == 0 {
		unit = defaultHairpinUnit
	}
	if n < unit/4 {
		return 0
	}
	return uint32((n + n/2 + unit - 1) / unit * unit)
}

// sortedNames returns the keys of m in order.
func sortedNames[V any](m map[model.ServicePortName]V) []model.ServicePortName {
	out := make([]model.ServicePortName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.SortFunc(out, model.ServicePortName.Compare)
	return out
}

// allocID returns an unused service port id: the oldest free one, else a
// new one.
func (st *state) allocID() uint32 {
	if len(st.free) > 0 {
		id := st.free[0]
		st.free = st.free[1:]
		return id
	}
	st.nextID++
	return st.nextID - 1
}

// fullTx is the transaction of a full sync and what it leaves in the
// table.
type fullTx struct {
	tx *nftnl.Batch
	// chains and sets are the chains (but the fingerprint chain) and
	// sets the table holds once tx is committed.
	chains, sets map[string]bool
	// fingerprint is the fingerprint chain tx adds.
	fingerprint string
	// hairpinSize is the size of the hairpin set tx leaves.
	hairpinSize uint32
}

// fullBatch builds the transaction that makes the kernel hold st, given
// how the table is to be treated and, unless it is created, the chains
// it holds (in deletion order; fingerprint chains among them are deleted
// unless tx adds the same).
func (b *backend) fullBatch(st *state, mode fullMode, stale, staleSets []string, perService bool) (*fullTx, error) {
	tx := nftnl.NewBatchSize(b.fi.proto, b.cfg.TableName, estimateBatch(st))
	tx.AddTable()
	if mode == fullReplace {
		tx.DelTable()
		tx.AddTable()
	}
	fresh := mode == fullCreate || mode == fullReplace
	specs := b.fi.fixedSetSpecs()
	chains := b.skeletonChains()
	for i := range chains {
		if err := b.r.encode(&chains[i]); err != nil {
			return nil, err
		}
	}
	// The shard objects the service ports use.
	for _, ref := range st.objects.sorted() {
		o, err := b.r.object(ref, st.objects.parts(ref.shard))
		if err != nil {
			return nil, err
		}
		if o.set != nil {
			specs = append(specs, o.set)
		} else {
			chains = append(chains, *o.chain)
		}
	}
	wantSet := map[string]bool{}
	// The hairpin set is sized from its elements. The kernel ignores
	// another size of a set that exists: when its size may differ, it
	// is deleted, once the one rule that reads it is flushed, and added
	// again in its place (neither flushes nor deletions count in the
	// fingerprint, so the batch has the fingerprint of one that
	// creates the table).
	hairpin := b.hairpinSize(len(st.refs[setHairpin]))
	for _, s := range specs {
		wantSet[s.Name] = true
		if s.Name == setHairpin {
			s.Size = hairpin
			exists := mode == fullInPlace || slices.Contains(staleSets, setHairpin)
			if !fresh && exists && (mode == fullTakeOver || b.st.hairpinSize != hairpin) {
				if mode == fullInPlace || slices.Contains(stale, chainNATPostrouting) {
					tx.FlushChain(chainNATPostrouting)
				}
				tx.DelSet(s.Name)
				tx.AddSet(s)
				continue
			}
		}
		tx.AddSet(s)
		if !fresh && (mode == fullTakeOver || !strings.HasPrefix(s.Name, setAffinityPrefix)) {
			tx.FlushSet(s.Name)
		}
	}
	names := sortedNames(st.services)
	var svcChains []*chainObj
	for _, n := range names {
		objs := st.services[n].objs
		for i := range objs.chains {
			svcChains = append(svcChains, &objs.chains[i])
		}
	}
	want := map[string]bool{}
	for _, c := range chains {
		tx.AddChain(c.name, c.hook)
		want[c.name] = true
	}
	for _, c := range svcChains {
		if err := b.ensureEncoded(c); err != nil {
			return nil, err
		}
		tx.AddChain(c.name, nil)
		want[c.name] = true
	}
	if !fresh {
		for _, c := range chains {
			tx.FlushChain(c.name)
		}
		for _, c := range svcChains {
			tx.FlushChain(c.name)
		}
		// Chains of the previous state that are gone.
		tx.SetOwner(owner(nil))
		for _, c := range stale {
			if !want[c] && !isFingerprint(c) {
				tx.DelChain(c)
			}
		}
		// Sets no rule reads any more (their rules are flushed or
		// deleted above).
		for _, s := range staleSets {
			if !wantSet[s] {
				tx.DelSet(s)
			}
		}
	}
	for _, c := range chains {
		for _, r := range c.enc {
			tx.AddRule(c.name, r)
		}
	}
	for _, n := range names {
		objs := st.services[n].objs
		tx.SetOwner(owner(&n))
		for ci := range objs.chains {
			for _, r := range objs.chains[ci].enc {
				tx.AddRule(objs.chains[ci].name, r)
			}
		}
	}
	tx.SetOwner(owner(nil))

	// Elements, grouped per set. Range sets are spelled out at the end,
	// in key order, straight into the batch.
	bySet := map[string][]elem{}
	type rangeRef struct {
		r     *rangeSpec
		slots []netip.AddrPort
	}
	rangesBySet := map[string][]rangeRef{}
	static := b.staticElems(st)
	if !perService {
		// Sized first: growing slices of 100,000 elements allocates
		// several times their size.
		sizes := map[string]int{}
		for _, e := range static {
			sizes[e.set]++
		}
		for _, s := range st.services {
			for _, e := range s.objs.fixed {
				sizes[e.set]++
			}
		}
		for set, n := range sizes {
			if !refcounted(set) {
				bySet[set] = make([]elem, 0, n)
			}
		}
	}
	for _, e := range static {
		bySet[e.set] = append(bySet[e.set], e.e)
	}
	for _, n := range names {
		o := st.services[n].objs
		if perService {
			own := map[string][]elem{}
			for _, e := range o.ownElems() {
				own[e.set] = append(own[e.set], e.e)
			}
			for _, op := range grouped(&n, own) {
				tx.SetOwner(owner(op.svc))
				tx.AddElems(op.set, op.elems)
			}
			continue
		}
		for _, e := range o.fixed {
			if !refcounted(e.set) {
				bySet[e.set] = append(bySet[e.set], e.e)
			}
		}
		for i := range o.ranges {
			r := &o.ranges[i]
			rangesBySet[r.set] = append(rangesBySet[r.set], rangeRef{r: r, slots: o.slots[r.group]})
		}
	}
	tx.SetOwner(owner(nil))
	// Elements go into the batch in chunks, spelled out in buf and keys.
	var buf []elem
	var keys []byte
	flush := func(set string) {
		if len(buf) > 0 {
			tx.AddElems(set, buf)
		}
		buf, keys = buf[:0], keys[:0]
	}
	for _, s := range specs {
		if len(bySet[s.Name]) > 0 {
			if s.Interval {
				sortElems(bySet[s.Name])
			}
			tx.AddElems(s.Name, bySet[s.Name])
		}
		if refs := st.refs[s.Name]; len(refs) > 0 {
			// In key order, so that the batch, and its fingerprint,
			// depend on st alone; in chunks, through one buffer.
			addrs := make([]netip.Addr, 0, len(refs))
			for a := range refs {
				addrs = append(addrs, a)
			}
			slices.SortFunc(addrs, netip.Addr.Compare)
			for _, a := range addrs {
				start := len(keys)
				keys = b.fi.refKey(keys, s.Name, a)
				buf = append(buf, elem{Key: keys[start:len(keys):len(keys)]})
				if len(buf) >= 4096 {
					flush(s.Name)
				}
			}
			flush(s.Name)
		}
		refs := rangesBySet[s.Name]
		slices.SortFunc(refs, func(a, b rangeRef) int { return bytes.Compare(a.r.prefix, b.r.prefix) })
		for _, ref := range refs {
			starts := rangeStarts(len(ref.slots))
			for i, ep := range ref.slots {
				buf, keys = appendRangeBuf(buf, keys, ref.r, starts, i, ep)
			}
			if len(buf) >= 4096 {
				flush(s.Name)
			}
		}
		flush(s.Name)
	}
	f := &fullTx{tx: tx, chains: want, sets: wantSet, hairpinSize: hairpin}
	b.addFingerprint(f, stale)
	return f, nil
}

// estimateBatch returns about the size of the full batch of st, so that
// the buffer is allocated once (growing a 30 MB buffer costs page faults
// over and over).
func estimateBatch(st *state) int {
	n := 256 << 10 // the skeleton
	for _, s := range st.services {
		o := s.objs
		n += len(o.fixed) * 64
		for _, c := range o.chains {
			n += 128
			for _, r := range c.enc {
				n += len(r) + 64
			}
		}
		for _, r := range o.ranges {
			n += 2 * len(o.slots[r.group]) * 40
		}
	}
	for _, m := range st.refs {
		n += len(m) * 32
	}
	return n + n/8
}

// sortElems orders the elements of an interval set by key, an interval
// end before a start at the same key. The kernel's rbtree checks each
// insertion for overlaps by walking from its neighbours past elements
// deleted in the same transaction: in key order, after a flush, that walk
// is short; in any other order it crosses the whole flushed set.
func sortElems(els []elem) {
	slices.SortFunc(els, func(a, b elem) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		if a.IntervalEnd != b.IntervalEnd {
			if a.IntervalEnd {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.KeyEnd, b.KeyEnd)
	})
}

func (b *backend) ensureEncoded(c *chainObj) error {
	if c.enc != nil {
		return nil
	}
	return b.r.encode(c)
}

// chainNames returns the service chains of st, external chains first,
// then the shared chains: the order in which they can be deleted.
func (st *state) chainNames() []string {
	var ext, svc []string
	for _, s := range st.services {
		for _, c := range s.objs.chains {
			if strings.HasPrefix(c.name, "ext-") {
				ext = append(ext, c.name)
			} else {
				svc = append(svc, c.name)
			}
		}
	}
	slices.Sort(ext)
	slices.Sort(svc)
	var shared []string
	for _, ref := range st.objects.sorted() {
		if !ref.isSet() {
			shared = append(shared, ref.name())
		}
	}
	return slices.Concat(ext, svc, shared)
}

// setNames returns the shard sets of st.
func (st *state) setNames() []string {
	var out []string
	for _, ref := range st.objects.sorted() {
		if ref.isSet() {
			out = append(out, ref.name())
		}
	}
	return out
}

// claim records name as the owner of the dispatch keys and range set
// prefixes of objs. It fails, claiming nothing, if another service port
// holds one of them. released holds keys freed in the same sync (nil:
// none).
func (st *state) claim(name model.ServicePortName, objs *svcObjs, released map[string]map[string]bool) error {
	var err error
	objs.ownedKeys(func(sp, k, set string) bool {
		if o, ok := st.owners[sp][k]; ok && o != name && !released[sp][k] {
			err = fmt.Errorf("%s is already used by %s", describeKey(set), o)
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	objs.ownedKeys(func(sp, k, _ string) bool {
		if st.owners[sp] == nil {
			st.owners[sp] = map[string]model.ServicePortName{}
		}
		st.owners[sp][k] = name
		return true
	})
	return nil
}

// taken returns a prefixTaken for name: prefixes another service port holds.
func (st *state) taken(name model.ServicePortName) prefixTaken {
	return func(set string, prefix []byte) bool {
		o, ok := st.owners[prefixSpace(set)][string(prefix)]
		return ok && o != name
	}
}

// release drops name's claims on the keys of objs.
func (st *state) release(name model.ServicePortName, objs *svcObjs) {
	objs.ownedKeys(func(sp, k, _ string) bool {
		if st.owners[sp][k] == name {
			delete(st.owners[sp], k)
		}
		return true
	})
}

func describeKey(set string) string {
	switch ownerSpace(set) {
	case "nodeport":
		return "node port"
	case "firewall":
		return "load-balancer address"
	}
	return "address and port"
}

// use adds d to the reference counts of objs' shared elements.
func (st *state) use(objs *svcObjs, d int) {
	objs.eachRef(func(set string, a netip.Addr) {
		m := st.refs[set]
		if m == nil {
			m = map[netip.Addr]int{}
			st.refs[set] = m
		}
		if n := m[a] + d; n > 0 {
			m[a] = n
		} else {
			delete(m, a)
		}
	})
}

// notApplied marks err with [proxier.ErrNotApplied] when it is the
// kernel's rejection of a transaction, which applies nothing of it.
func notApplied(err error) error {
	var txErr *TxError
	if errors.As(err, &txErr) {
		return fmt.Errorf("%w: %w", proxier.ErrNotApplied, err)
	}
	return err
}

// dropRejected adds the service ports a failed transaction names to skip.
// It reports false if the failure is not (only) theirs.
func (b *backend) dropRejected(err error, skip map[model.ServicePortName]error) bool {
	var txErr *TxError
	if !errors.As(err, &txErr) || len(txErr.Failures) == 0 {
		return false
	}
	for i := range txErr.Failures {
		// ENOENT means a table, chain, set or element the backend
		// remembers is not in the kernel: the dataplane changed behind
		// its back, which is no fault of the service port.
		f := &txErr.Failures[i]
		if rejectedService(f) == nil || errors.Is(f.Err, unix.ENOENT) {
			return false
		}
	}
	for i := range txErr.Failures {
		f := &txErr.Failures[i]
		svc := rejectedService(f)
		b.log.Warn("kernel rejected a service port; skipping it", "service", svc.String(), "op", f.What, "err", f.Err)
		skip[*svc] = fmt.Errorf("kernel rejected %s: %w", f.What, f.Err)
	}
	return true
}
