package nftables

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file computes and sends the difference for the service ports a
// request names as changed. It reads only the in-memory state: an
// incremental sync never lists or reads the kernel, so its cost follows
// the size of the change, not of the table.

// delta is a pending change to a state, applied only once the kernel
// accepted the transaction.
type delta struct {
	base     *state
	services map[model.ServicePortName]*svcState // nil value: deleted
	owners   map[string]map[string]*model.ServicePortName
	refs     refCounts
	objects  objectCounts // differences to base.objects
	nextID   uint32
	nextAID  uint32
	// freeUsed counts the ids taken from the head of base.free; freed
	// are the ids of deleted service ports, free from the next sync on.
	freeUsed int
	freed    []uint32
	// hairpinGrowth is the number of hairpin elements the change adds
	// less those it deletes.
	hairpinGrowth int
}

func newDelta(base *state) *delta {
	return &delta{
		base:     base,
		services: map[model.ServicePortName]*svcState{},
		owners:   map[string]map[string]*model.ServicePortName{},
		refs:     refCounts{},
		objects:  objectCounts{},
		nextID:   base.nextID,
		nextAID:  base.nextAID,
	}
}

// allocID returns an unused service port id (see state.allocID).
func (d *delta) allocID() uint32 {
	if d.freeUsed < len(d.base.free) {
		d.freeUsed++
		return d.base.free[d.freeUsed-1]
	}
	d.nextID++
	return d.nextID - 1
}

func (d *delta) newAID() uint32 {
	d.nextAID++
	return d.nextAID - 1
}

func (d *delta) owner(sp, key string) (model.ServicePortName, bool) {
	if o, ok := d.owners[sp][key]; ok {
		if o == nil {
			return model.ServicePortName{}, false
		}
		return *o, true
	}
	o, ok := d.base.owners[sp][key]
	return o, ok
}

func (d *delta) setOwner(sp, key string, o *model.ServicePortName) {
	if d.owners[sp] == nil {
		d.owners[sp] = map[string]*model.ServicePortName{}
	}
	d.owners[sp][key] = o
}

func (d *delta) release(name model.ServicePortName, objs *svcObjs) {
	objs.ownedKeys(func(sp, k, _ string) bool {
		if o, ok := d.owner(sp, k); ok && o == name {
			d.setOwner(sp, k, nil)
		}
		return true
	})
}

func (d *delta) claim(name model.ServicePortName, objs *svcObjs) error {
	var err error
	objs.ownedKeys(func(sp, k, set string) bool {
		if o, ok := d.owner(sp, k); ok && o != name {
			err = fmt.Errorf("%s is already used by %s", describeKey(set), o)
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	n := name
	objs.ownedKeys(func(sp, k, _ string) bool {
		d.setOwner(sp, k, &n)
		return true
	})
	return nil
}

// taken returns a prefixTaken for name (see state.taken).
func (d *delta) taken(name model.ServicePortName) prefixTaken {
	return func(set string, prefix []byte) bool {
		o, ok := d.owner(prefixSpace(set), string(prefix))
		return ok && o != name
	}
}

func (d *delta) use(objs *svcObjs, n int) {
	objs.eachRef(func(set string, a netip.Addr) { d.count(set, a, n) })
}

// useDiff counts the refcounted elements of new instead of old's, a
// service port's renderings: those of their fixed elements, and the
// hairpin elements of the endpoints whose slots differ, so that a change
// of one endpoint costs the same whatever the size of its group. The
// counts end as after use(old, -1) and use(new, +1).
func (d *delta) useDiff(old, new *svcObjs) {
	for _, e := range old.fixed {
		if refcounted(e.set) {
			d.count(e.set, refAddr(e.e.Key), -1)
		}
	}
	for _, e := range new.fixed {
		if refcounted(e.set) {
			d.count(e.set, refAddr(e.e.Key), +1)
		}
	}
	for g := range old.slots {
		o, n := old.slots[g], new.slots[g]
		for j := range max(len(o), len(n)) {
			var a, b netip.Addr
			if j < len(o) {
				a = o[j].Addr()
			}
			if j < len(n) {
				b = n[j].Addr()
			}
			if a == b {
				continue
			}
			if a.IsValid() {
				d.count(setHairpin, a, -1)
			}
			if b.IsValid() {
				d.count(setHairpin, b, +1)
			}
		}
	}
}

// count adds n to the use count of a's element in set.
func (d *delta) count(set string, a netip.Addr, n int) {
	if d.refs[set] == nil {
		d.refs[set] = map[netip.Addr]int{}
	}
	d.refs[set][a] += n
}

// apply makes the change part of the base state.
func (d *delta) apply() {
	st := d.base
	for n, s := range d.services {
		if s == nil {
			delete(st.services, n)
		} else {
			st.services[n] = s
		}
	}
	for sp, m := range d.owners {
		if st.owners[sp] == nil {
			st.owners[sp] = map[string]model.ServicePortName{}
		}
		for k, o := range m {
			if o == nil {
				delete(st.owners[sp], k)
			} else {
				st.owners[sp][k] = *o
			}
		}
	}
	for set, m := range d.refs {
		if st.refs[set] == nil {
			st.refs[set] = map[netip.Addr]int{}
		}
		for k, n := range m {
			if st.refs[set][k] += n; st.refs[set][k] <= 0 {
				delete(st.refs[set], k)
			}
		}
	}
	for ref, n := range d.objects {
		if st.objects[ref] += n; st.objects[ref] <= 0 {
			delete(st.objects, ref)
		}
	}
	st.nextID = d.nextID
	st.nextAID = d.nextAID
	st.free = append(st.free[d.freeUsed:len(st.free):len(st.free)], d.freed...)
}

// plan collects the operations of an incremental transaction.
type plan struct {
	newChains     []*chainObj
	changedChains []*chainObj
	delChains     []string
	delElems      []elemOp
	addElems      []elemOp
	// newObjects and delObjects are the shard objects the change makes
	// the first user of and leaves unused.
	newObjects, delObjects []shardRef
	// parts returns the parts of a shard's endpoint maps in use after
	// the change.
	parts func(shard uint32) partSet
	owner map[string]*model.ServicePortName // chain -> service, for errors
}

// elemOp adds or deletes elements of one set for one service port (nil:
// shared elements).
type elemOp struct {
	svc   *model.ServicePortName
	set   string
	elems []elem
}

// grouped turns per-set element lists into operations, in set order.
func grouped(svc *model.ServicePortName, bySet map[string][]elem) []elemOp {
	var ops []elemOp
	for _, set := range slices.Sorted(maps.Keys(bySet)) {
		ops = append(ops, elemOp{svc: svc, set: set, elems: bySet[set]})
	}
	return ops
}

func (b *backend) syncIncremental(ctx context.Context, req *proxier.SyncRequest) error {
	start := time.Now()
	skip := map[model.ServicePortName]error{}
	for attempt := 0; ; attempt++ {
		d, tx, objErrs, err := b.buildIncremental(req, skip)
		if err != nil {
			return err
		}
		if size := b.st.hairpinSize; size > 0 && len(b.st.refs[setHairpin])+d.hairpinGrowth > int(size) {
			b.log.Info("hairpin set full: a full sync sizes it again", "size", size,
				"elements", len(b.st.refs[setHairpin])+d.hairpinGrowth)
			return b.syncFull(ctx, req)
		}
		fp := b.st.fingerprint
		if tx.Len() > 0 && fp != "" {
			// The table no longer holds what the fingerprint says.
			tx.SetOwner(owner(nil))
			tx.DelChain(fp)
			fp = ""
		}
		built := time.Now()
		if tx.Len() > 0 {
			err = b.conn.Commit(ctx, tx)
		}
		if err == nil {
			d.apply()
			b.st.fingerprint = fp
			b.last = syncStats{render: built.Sub(start), kernel: time.Since(built),
				messages: tx.Len(), bytes: tx.Size(), elems: tx.Elems(), services: len(req.Changed)}
			b.log.Debug("incremental sync", "changed", len(req.Changed), "messages", tx.Len(),
				"bytes", tx.Size(), "duration", time.Since(start))
			return proxier.JoinObjectErrors(objErrs, skip)
		}
		if !b.dropRejected(err, skip) || attempt >= maxRetries {
			return fmt.Errorf("nftables: sync: %w", notApplied(err))
		}
	}
}

// buildIncremental renders the changed service ports (except those in
// skip, which keep what they have) and builds the transaction.
func (b *backend) buildIncremental(req *proxier.SyncRequest, skip map[model.ServicePortName]error) (*delta, *nftnl.Batch, map[model.ServicePortName]error, error) {
	st := b.st
	d := newDelta(st)
	errs := map[model.ServicePortName]error{}
	var names []model.ServicePortName
	for n := range req.Changed {
		if _, ok := skip[n]; !ok {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, model.ServicePortName.Compare)

	for _, n := range names {
		if old := st.services[n]; old != nil {
			d.release(n, old.objs)
			d.objects.add(old.objs, -1)
		}
	}
	for _, n := range names {
		old := st.services[n]
		sp := req.State.Services[n]
		if sp == nil {
			if old != nil {
				d.use(old.objs, -1)
				d.services[n] = nil
				d.freed = append(d.freed, old.id)
			}
			continue
		}
		var id uint32
		var prev *svcObjs
		if old != nil {
			id, prev = old.id, old.objs
		} else {
			id = d.allocID()
		}
		objs, err := b.r.service(n, sp, req.Targets[n], svcAlloc{id: id, prev: prev, newAID: d.newAID, taken: d.taken(n)})
		if err == nil {
			err = d.claim(n, objs)
		}
		if err != nil {
			errs[n] = err
			// The service port is left out: it is deleted if it
			// was programmed, and its id is free either way.
			if old != nil {
				d.use(old.objs, -1)
				d.services[n] = nil
			}
			d.freed = append(d.freed, id)
			continue
		}
		if prev != nil {
			d.useDiff(prev, objs)
		} else {
			d.use(objs, +1)
		}
		d.objects.add(objs, +1)
		d.services[n] = &svcState{id: id, objs: objs}
	}

	p := &plan{owner: map[string]*model.ServicePortName{}}
	for _, n := range names {
		var oldObjs, newObjs *svcObjs
		if old := st.services[n]; old != nil {
			oldObjs = old.objs
		}
		if s, ok := d.services[n]; ok && s != nil {
			newObjs = s.objs
		} else if !ok {
			continue // unchanged (a failed render of a new service)
		}
		if err := b.diffService(p, n, oldObjs, newObjs); err != nil {
			return nil, nil, nil, err
		}
	}
	b.diffShared(p, d)
	for ref, n := range d.objects {
		before := st.objects[ref]
		switch after := before + n; {
		case before == 0 && after > 0:
			p.newObjects = append(p.newObjects, ref)
		case before > 0 && after <= 0:
			p.delObjects = append(p.delObjects, ref)
		}
	}
	slices.SortFunc(p.newObjects, compareRefs)
	slices.SortFunc(p.delObjects, func(a, b shardRef) int { return compareRefs(b, a) })
	if err := b.diffParts(p, d); err != nil {
		return nil, nil, nil, err
	}
	tx, err := b.incrementalBatch(p)
	if err != nil {
		return nil, nil, nil, err
	}
	return d, tx, errs, nil
}

// diffService adds the operations that turn old into new to p; either may
// be nil.
func (b *backend) diffService(p *plan, name model.ServicePortName, old, new *svcObjs) error {
	n := name
	oldChains := map[string]*chainObj{}
	if old != nil {
		for i := range old.chains {
			oldChains[old.chains[i].name] = &old.chains[i]
		}
	}
	if new != nil {
		for i := range new.chains {
			c := &new.chains[i]
			if err := b.ensureEncoded(c); err != nil {
				return err
			}
			p.owner[c.name] = &n
			o, ok := oldChains[c.name]
			switch {
			case !ok:
				p.newChains = append(p.newChains, c)
			case !slices.EqualFunc(o.enc, c.enc, bytes.Equal):
				p.changedChains = append(p.changedChains, c)
			}
			delete(oldChains, c.name)
		}
	}
	for name := range oldChains {
		p.delChains = append(p.delChains, name)
		p.owner[name] = &n
	}

	dels, adds := map[string][]elem{}, map[string][]elem{}
	oldElems := map[string]*setElem{}
	if old != nil {
		for i := range old.fixed {
			if e := &old.fixed[i]; !refcounted(e.set) {
				oldElems[e.set+"\x00"+e.id()] = e
			}
		}
	}
	if new != nil {
		for i := range new.fixed {
			e := &new.fixed[i]
			if refcounted(e.set) {
				continue
			}
			k := e.set + "\x00" + e.id()
			if o, ok := oldElems[k]; ok {
				delete(oldElems, k)
				if o.sameData(e) {
					continue
				}
				dels[o.set] = append(dels[o.set], o.e)
			}
			adds[e.set] = append(adds[e.set], e.e)
		}
	}
	for _, o := range oldElems {
		dels[o.set] = append(dels[o.set], o.e)
	}
	diffRanges(dels, adds, old, new)
	p.delElems = append(p.delElems, grouped(&n, dels)...)
	p.addElems = append(p.addElems, grouped(&n, adds)...)
	return nil
}

// diffRanges adds to dels and adds the range elements that turn old's
// range sets into new's (either may be nil). A range set that keeps its
// prefix and its number of endpoints keeps its boundaries: only the
// ranges whose endpoint changed are replaced, start and end (deleted and
// added again in one transaction: the kernel checks intervals for
// overlaps at each insertion), so replacing one endpoint writes four
// elements whatever the size of the group. Any other range set is
// replaced as a whole.
func diffRanges(dels, adds map[string][]elem, old, new *svcObjs) {
	type key struct{ set, prefix string }
	kept := map[key]bool{}
	if new != nil {
		var oldSpecs map[key]*rangeSpec
		if old != nil {
			oldSpecs = make(map[key]*rangeSpec, len(old.ranges))
			for i := range old.ranges {
				r := &old.ranges[i]
				oldSpecs[key{r.set, string(r.prefix)}] = r
			}
		}
		for i := range new.ranges {
			r := &new.ranges[i]
			slots := new.slots[r.group]
			k := key{r.set, string(r.prefix)}
			o := oldSpecs[k]
			if o == nil || len(old.slots[o.group]) != len(slots) {
				adds[r.set] = appendRanges(adds[r.set], r, slots)
				continue
			}
			kept[k] = true
			prev := old.slots[o.group]
			var starts []uint32
			for j := range slots {
				if slots[j] == prev[j] {
					continue
				}
				if starts == nil {
					starts = rangeStarts(len(slots))
				}
				dels[o.set] = appendRange(dels[o.set], o, starts, j, prev[j])
				adds[r.set] = appendRange(adds[r.set], r, starts, j, slots[j])
			}
		}
	}
	if old != nil {
		for i := range old.ranges {
			if o := &old.ranges[i]; !kept[key{o.set, string(o.prefix)}] {
				dels[o.set] = appendRanges(dels[o.set], o, old.slots[o.group])
			}
		}
	}
}

// rangeSet reports whether set is an endpoint map, whose elements are
// ranges.
func rangeSet(set string) bool { return strings.HasPrefix(set, setEndpointsPrefix) }

// diffShared adds the refcounted elements whose use count crosses zero.
func (b *backend) diffShared(p *plan, d *delta) {
	dels, adds := map[string][]elem{}, map[string][]elem{}
	defer func() {
		p.delElems = append(p.delElems, grouped(nil, dels)...)
		p.addElems = append(p.addElems, grouped(nil, adds)...)
	}()
	for set, m := range d.refs {
		for a, n := range m {
			before := d.base.refs[set][a]
			after := before + n
			key := b.fi.refKey(nil, set, a)
			switch {
			case before == 0 && after > 0:
				adds[set] = append(adds[set], elem{Key: key})
				if set == setHairpin {
					d.hairpinGrowth++
				}
			case before > 0 && after <= 0:
				dels[set] = append(dels[set], elem{Key: key})
				if set == setHairpin {
					d.hairpinGrowth--
				}
			}
		}
	}
}

// diffParts sets p.parts, and rewrites the shared chains that stay
// while the parts of their shard's endpoint maps in use change: they
// read one more or one fewer (a rule change, rare: the parts of a shard
// come into use as the table grows past multiples of numShards service
// ports).
func (b *backend) diffParts(p *plan, d *delta) error {
	st := d.base
	p.parts = func(shard uint32) partSet {
		return partsOf(shard, func(ref shardRef) int { return st.objects[ref] + d.objects[ref] })
	}
	shards := map[uint32]bool{}
	for ref, n := range d.objects {
		if ref.kind == objEndpoints && n != 0 {
			shards[ref.shard] = true
		}
	}
	for _, shard := range slices.Sorted(maps.Keys(shards)) {
		before, after := st.objects.parts(shard), p.parts(shard)
		if before == after {
			continue
		}
		for kind := objCluster; kind <= objNodePort; kind++ {
			ref := shardRef{kind: kind, shard: shard}
			if st.objects[ref] <= 0 || st.objects[ref]+d.objects[ref] <= 0 {
				continue // new or deleted: built with after, or gone
			}
			o, err := b.r.object(ref, after)
			if err != nil {
				return err
			}
			p.changedChains = append(p.changedChains, o.chain)
		}
	}
	return nil
}

// incrementalBatch orders p's operations so every reference is valid at
// each step: chains exist before rules and elements point to them, and
// elements and rules that point to a chain go before it.
func (b *backend) incrementalBatch(p *plan) (*nftnl.Batch, error) {
	tx := nftnl.NewBatch(b.fi.proto, b.cfg.TableName)
	// Shard objects first used: sets, then the shared chains that read
	// them.
	var newShared []*chainObj
	for _, ref := range p.newObjects {
		o, err := b.r.object(ref, p.parts(ref.shard))
		if err != nil {
			return nil, err
		}
		if o.set != nil {
			tx.AddSet(o.set)
			continue
		}
		tx.AddChain(o.chain.name, nil)
		newShared = append(newShared, o.chain)
	}
	for _, c := range newShared {
		for _, r := range c.enc {
			tx.AddRule(c.name, r)
		}
	}
	for _, c := range p.newChains {
		tx.SetOwner(owner(p.owner[c.name]))
		tx.AddChain(c.name, nil)
	}
	for _, c := range p.changedChains {
		tx.SetOwner(owner(p.owner[c.name]))
		tx.FlushChain(c.name)
	}
	for _, op := range p.delElems {
		tx.SetOwner(owner(op.svc))
		tx.DelElems(op.set, op.elems)
	}
	slices.SortFunc(p.delChains, func(a, b string) int { return deleteOrder(a) - deleteOrder(b) })
	for _, c := range p.delChains {
		tx.SetOwner(owner(p.owner[c]))
		tx.DelChain(c)
	}
	// Shard objects left unused, once nothing refers to them: shared
	// chains, then sets.
	tx.SetOwner(owner(nil))
	for _, ref := range p.delObjects {
		if ref.isSet() {
			tx.DelSet(ref.name())
		} else {
			tx.DelChain(ref.name())
		}
	}
	for _, c := range slices.Concat(p.newChains, p.changedChains) {
		if c.enc == nil {
			if err := b.r.encode(c); err != nil {
				tx.SetErr(err)
				continue
			}
		}
		tx.SetOwner(owner(p.owner[c.name]))
		for _, r := range c.enc {
			tx.AddRule(c.name, r)
		}
	}
	for _, op := range p.addElems {
		tx.SetOwner(owner(op.svc))
		if rangeSet(op.set) {
			sortElems(op.elems)
		}
		tx.AddElems(op.set, op.elems)
	}
	return tx, nil
}

// deleteOrder sorts chains for deletion: external chains (which may jump
// to service chains) first.
func deleteOrder(chain string) int {
	if strings.HasPrefix(chain, "ext-") {
		return 0
	}
	return 1
}
