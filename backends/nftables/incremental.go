package nftables

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
	refs     map[string]map[string]int
	nextID   uint32
}

func newDelta(base *state) *delta {
	return &delta{
		base:     base,
		services: map[model.ServicePortName]*svcState{},
		owners:   map[string]map[string]*model.ServicePortName{},
		refs:     map[string]map[string]int{},
		nextID:   base.nextID,
	}
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
	for _, e := range objs.elems {
		if sp := ownerSpace(e.set); sp != "" {
			if o, ok := d.owner(sp, e.id()); ok && o == name {
				d.setOwner(sp, e.id(), nil)
			}
		}
	}
}

func (d *delta) claim(name model.ServicePortName, objs *svcObjs) error {
	for _, e := range objs.elems {
		if sp := ownerSpace(e.set); sp != "" {
			if o, ok := d.owner(sp, e.id()); ok && o != name {
				return fmt.Errorf("%s is already used by %s", describeKey(e.set), o)
			}
		}
	}
	n := name
	for _, e := range objs.elems {
		if sp := ownerSpace(e.set); sp != "" {
			d.setOwner(sp, e.id(), &n)
		}
	}
	return nil
}

func (d *delta) use(objs *svcObjs, n int) {
	for _, e := range objs.elems {
		if refcounted(e.set) {
			if d.refs[e.set] == nil {
				d.refs[e.set] = map[string]int{}
			}
			d.refs[e.set][e.id()] += n
		}
	}
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
			st.refs[set] = map[string]int{}
		}
		for k, n := range m {
			if st.refs[set][k] += n; st.refs[set][k] <= 0 {
				delete(st.refs[set], k)
			}
		}
	}
	st.nextID = d.nextID
}

// plan collects the operations of an incremental transaction.
type plan struct {
	newChains     []*chainObj
	changedChains []*chainObj
	delChains     []string
	delElems      []elemOp
	addElems      []elemOp
	owner         map[string]*model.ServicePortName // chain -> service, for errors
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

func (b *backend) syncIncremental(req *proxier.SyncRequest) error {
	start := time.Now()
	skip := map[model.ServicePortName]error{}
	for attempt := 0; ; attempt++ {
		d, tx, objErrs, err := b.buildIncremental(req, skip)
		if err != nil {
			return err
		}
		if tx.Len() > 0 {
			err = b.conn.commit(tx)
		}
		if err == nil {
			d.apply()
			b.log.Debug("incremental sync", "changed", len(req.Changed), "messages", tx.Len(),
				"bytes", tx.Size(), "duration", time.Since(start))
			return joinObjectErrors(objErrs, skip)
		}
		if !b.dropRejected(err, skip) || attempt >= maxRetries {
			return fmt.Errorf("nftables: sync: %w", err)
		}
	}
}

// buildIncremental renders the changed service ports (except those in
// skip, which keep what they have) and builds the transaction.
func (b *backend) buildIncremental(req *proxier.SyncRequest, skip map[model.ServicePortName]error) (*delta, *batch, map[model.ServicePortName]error, error) {
	st := b.st
	d := newDelta(st)
	errs := map[model.ServicePortName]error{}
	var names []model.ServicePortName
	for n := range req.Changed {
		if _, ok := skip[n]; !ok {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, compareNames)

	for _, n := range names {
		if old := st.services[n]; old != nil {
			d.release(n, old.objs)
			d.use(old.objs, -1)
		}
	}
	for _, n := range names {
		old := st.services[n]
		sp := req.State.Services[n]
		if sp == nil {
			if old != nil {
				d.services[n] = nil
			}
			continue
		}
		var id uint32
		var prev *svcObjs
		if old != nil {
			id, prev = old.id, old.objs
		} else {
			id = d.nextID
			d.nextID++
		}
		objs, err := b.r.service(n, sp, req.Targets[n], id, prev)
		if err == nil {
			err = d.claim(n, objs)
		}
		if err != nil {
			errs[n] = err
			if old != nil {
				d.services[n] = nil
			}
			continue
		}
		d.use(objs, +1)
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
	return d, b.incrementalBatch(p), errs, nil
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
		for i := range old.elems {
			e := &old.elems[i]
			if !refcounted(e.set) {
				oldElems[e.set+"\x00"+e.id()] = e
			}
		}
	}
	if new != nil {
		for i := range new.elems {
			e := &new.elems[i]
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
	p.delElems = append(p.delElems, grouped(&n, dels)...)
	p.addElems = append(p.addElems, grouped(&n, adds)...)
	return nil
}

// diffShared adds the refcounted elements whose use count crosses zero.
func (b *backend) diffShared(p *plan, d *delta) {
	dels, adds := map[string][]elem{}, map[string][]elem{}
	defer func() {
		p.delElems = append(p.delElems, grouped(nil, dels)...)
		p.addElems = append(p.addElems, grouped(nil, adds)...)
	}()
	for set, m := range d.refs {
		for k, n := range m {
			before := d.base.refs[set][k]
			after := before + n
			key := []byte(strings.TrimSuffix(k, "|"))
			switch {
			case before == 0 && after > 0:
				adds[set] = append(adds[set], elem{key: key})
			case before > 0 && after <= 0:
				dels[set] = append(dels[set], elem{key: key})
			}
		}
	}
}

// incrementalBatch orders p's operations so every reference is valid at
// each step: chains exist before rules and elements point to them, and
// elements and rules that point to a chain go before it.
func (b *backend) incrementalBatch(p *plan) *batch {
	tx := newBatch(b.fi.proto, b.cfg.TableName)
	for _, c := range p.newChains {
		tx.forService(p.owner[c.name])
		tx.addChain(c.name, nil)
	}
	for _, c := range p.changedChains {
		tx.forService(p.owner[c.name])
		tx.flushChain(c.name)
	}
	for _, op := range p.delElems {
		tx.forService(op.svc)
		tx.delElems(op.set, op.elems)
	}
	slices.SortFunc(p.delChains, func(a, b string) int { return deleteOrder(a) - deleteOrder(b) })
	for _, c := range p.delChains {
		tx.forService(p.owner[c])
		tx.delChain(c)
	}
	for _, c := range slices.Concat(p.newChains, p.changedChains) {
		if c.enc == nil {
			if err := b.r.encode(c); err != nil {
				tx.setErr(err)
				continue
			}
		}
		tx.forService(p.owner[c.name])
		for _, r := range c.enc {
			tx.addRule(c.name, r)
		}
	}
	for _, op := range p.addElems {
		tx.forService(op.svc)
		tx.addElems(op.set, op.elems)
	}
	return tx
}

// deleteOrder sorts chains for deletion: external chains (which may jump
// to service chains) first.
func deleteOrder(chain string) int {
	if strings.HasPrefix(chain, "ext-") {
		return 0
	}
	return 1
}
