package nftables

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// backend programs one IP family of one network namespace.
type backend struct {
	cfg  Config
	fi   familyInfo
	r    *renderer
	ns   *netns.NS
	conn *conn
	log  *slog.Logger
	// st is what the kernel holds as of the last successful sync; nil
	// when unknown (before the first sync, after Cleanup).
	st *state
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
	nextID   uint32
	// refs counts the users of each element of a refcounted set.
	refs map[string]map[string]int
	// owners maps the dispatch keys (addresses, node ports, firewall
	// keys) to the service port that holds them.
	owners map[string]map[string]model.ServicePortName
}

type svcState struct {
	id   uint32
	objs *svcObjs
}

func newState() *state {
	return &state{
		services: map[model.ServicePortName]*svcState{},
		nextID:   1,
		refs:     map[string]map[string]int{},
		owners:   map[string]map[string]model.ServicePortName{},
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

// Sync makes the kernel match req in one transaction.
func (b *backend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if req == nil || req.State == nil {
		return errors.New("nftables: sync request without state")
	}
	if req.State.Family != 0 && req.State.Family != b.fi.fam {
		return fmt.Errorf("nftables: %s backend got %s state", b.fi.fam, req.State.Family)
	}
	if req.Full || b.st == nil {
		return b.syncFull(req)
	}
	return b.syncIncremental(req)
}

// maxRetries bounds how often a sync drops service ports the kernel
// rejected and tries again.
const maxRetries = 3

// syncFull converges the whole table. Without a known state (first sync of
// this process, or the table went missing) it replaces the table in the
// same transaction that fills it, so a restart never leaves a window
// without rules. With a known state it re-asserts every chain, rule and
// element but keeps the affinity map, so clients stay pinned.
func (b *backend) syncFull(req *proxier.SyncRequest) error {
	start := time.Now()
	recreate := b.st == nil
	if !recreate {
		exists, err := b.conn.tableExists(b.fi.proto, b.cfg.TableName)
		if err != nil {
			return fmt.Errorf("nftables: check table: %w", err)
		}
		if !exists {
			b.log.Warn("table was deleted behind our back; recreating it")
			recreate = true
		}
	}
	skip := map[model.ServicePortName]error{}
	for attempt := 0; ; attempt++ {
		st, objErrs := b.buildFull(req, recreate, skip)
		// After a failure nobody claimed, send each service port's
		// elements in messages of their own, so the next failure names
		// the service port.
		tx, err := b.fullBatch(st, recreate, attempt > 0)
		if err != nil {
			return err
		}
		built := time.Now()
		err = b.conn.commit(tx)
		if err == nil {
			b.st = st
			b.log.Info("full sync", "services", len(st.services), "messages", tx.Len(), "bytes", tx.Size(),
				"recreated", recreate, "render", built.Sub(start), "kernel", time.Since(built))
			return joinObjectErrors(objErrs, skip)
		}
		if !b.dropRejected(err, skip) || attempt >= maxRetries {
			return fmt.Errorf("nftables: full sync: %w", err)
		}
	}
}

// buildFull renders every service port of req into a new state. Service
// ports in skip are left out.
func (b *backend) buildFull(req *proxier.SyncRequest, recreate bool, skip map[model.ServicePortName]error) (*state, map[model.ServicePortName]error) {
	st := newState()
	old := b.st
	if recreate || old == nil {
		old = newState()
	} else {
		st.nextID = old.nextID
	}
	errs := map[model.ServicePortName]error{}
	for _, name := range slices.SortedFunc(maps.Keys(req.State.Services), compareNames) {
		if _, ok := skip[name]; ok {
			continue
		}
		var id uint32
		var prev *svcObjs
		if o := old.services[name]; o != nil {
			id, prev = o.id, o.objs
		} else {
			id = st.nextID
			st.nextID++
		}
		objs, err := b.r.service(name, req.State.Services[name], req.Targets[name], id, prev)
		if err == nil {
			err = st.claim(name, objs, nil)
		}
		if err != nil {
			errs[name] = err
			continue
		}
		st.services[name] = &svcState{id: id, objs: objs}
		st.use(objs, +1)
	}
	return st, errs
}

// fullBatch builds the transaction that makes the kernel hold st.
func (b *backend) fullBatch(st *state, recreate, perService bool) (*batch, error) {
	// About 1 KiB per service port with ten endpoints.
	tx := newBatchSize(b.fi.proto, b.cfg.TableName, 64<<10+len(st.services)*1200)
	tx.addTable()
	if recreate {
		tx.delTable()
		tx.addTable()
	}
	specs := b.fi.setSpecs(b.cfg.AffinityMapSize)
	for i, s := range specs {
		tx.addSet(s, uint32(i+1))
		if !recreate && !strings.HasPrefix(s.name, setAffinityPrefix) {
			tx.flushSet(s.name)
		}
	}
	chains := b.skeletonChains()
	for i := range chains {
		if err := b.r.encode(&chains[i]); err != nil {
			return nil, err
		}
	}
	names := slices.SortedFunc(maps.Keys(st.services), compareNames)
	var svcChains []*chainObj
	for _, n := range names {
		objs := st.services[n].objs
		for i := range objs.chains {
			svcChains = append(svcChains, &objs.chains[i])
		}
	}
	want := map[string]bool{}
	for _, c := range chains {
		tx.addChain(c.name, c.hook)
		want[c.name] = true
	}
	for _, c := range svcChains {
		if err := b.ensureEncoded(c); err != nil {
			return nil, err
		}
		tx.addChain(c.name, nil)
		want[c.name] = true
	}
	if !recreate {
		for _, c := range chains {
			tx.flushChain(c.name)
		}
		for _, c := range svcChains {
			tx.flushChain(c.name)
		}
		// Chains of the previous state that are gone.
		tx.forService(nil)
		for _, c := range b.st.chainNames() {
			if !want[c] {
				tx.delChain(c)
			}
		}
	}
	for _, c := range chains {
		for _, r := range c.enc {
			tx.addRule(c.name, r)
		}
	}
	for _, n := range names {
		objs := st.services[n].objs
		tx.forService(&n)
		for ci := range objs.chains {
			for _, r := range objs.chains[ci].enc {
				tx.addRule(objs.chains[ci].name, r)
			}
		}
	}
	tx.forService(nil)

	// Elements, grouped per set.
	count := map[string]int{}
	for _, n := range names {
		for _, e := range st.services[n].objs.elems {
			count[e.set]++
		}
	}
	bySet := make(map[string][]elem, len(count))
	for set, c := range count {
		bySet[set] = make([]elem, 0, c)
	}
	for _, e := range b.staticElems() {
		bySet[e.set] = append(bySet[e.set], e.e)
	}
	for _, n := range names {
		own := map[string][]elem{}
		for _, e := range st.services[n].objs.elems {
			if refcounted(e.set) {
				continue
			}
			if perService {
				own[e.set] = append(own[e.set], e.e)
			} else {
				bySet[e.set] = append(bySet[e.set], e.e)
			}
		}
		for _, op := range grouped(&n, own) {
			tx.forService(op.svc)
			tx.addElems(op.set, op.elems)
		}
	}
	tx.forService(nil)
	for set, keys := range st.refs {
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			bySet[set] = append(bySet[set], elem{key: []byte(strings.TrimSuffix(k, "|"))})
		}
	}
	for _, s := range specs {
		if len(bySet[s.name]) > 0 {
			tx.addElems(s.name, bySet[s.name])
		}
	}
	return tx, nil
}

func (b *backend) ensureEncoded(c *chainObj) error {
	if c.enc != nil {
		return nil
	}
	return b.r.encode(c)
}

// chainNames returns the service chains of st, external chains first:
// the order in which they can be deleted.
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
	return slices.Concat(ext, svc)
}

// claim records name as the owner of the dispatch keys of objs. It fails,
// claiming nothing, if another service port holds one of them. released
// holds keys freed in the same sync (nil: none).
func (st *state) claim(name model.ServicePortName, objs *svcObjs, released map[string]map[string]bool) error {
	for _, e := range objs.elems {
		sp := ownerSpace(e.set)
		if sp == "" {
			continue
		}
		if o, ok := st.owners[sp][e.id()]; ok && o != name && !released[sp][e.id()] {
			return fmt.Errorf("%s is already used by %s", describeKey(e.set), o)
		}
	}
	for _, e := range objs.elems {
		if sp := ownerSpace(e.set); sp != "" {
			if st.owners[sp] == nil {
				st.owners[sp] = map[string]model.ServicePortName{}
			}
			st.owners[sp][e.id()] = name
		}
	}
	return nil
}

// release drops name's claims on the keys of objs.
func (st *state) release(name model.ServicePortName, objs *svcObjs) {
	for _, e := range objs.elems {
		if sp := ownerSpace(e.set); sp != "" && st.owners[sp][e.id()] == name {
			delete(st.owners[sp], e.id())
		}
	}
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
	for _, e := range objs.elems {
		if !refcounted(e.set) {
			continue
		}
		m := st.refs[e.set]
		if m == nil {
			m = map[string]int{}
			st.refs[e.set] = m
		}
		if m[e.id()] += d; m[e.id()] <= 0 {
			delete(m, e.id())
		}
	}
}

// dropRejected adds the service ports a failed transaction names to skip.
// It reports false if the failure is not (only) theirs.
func (b *backend) dropRejected(err error, skip map[model.ServicePortName]error) bool {
	var txErr *TxError
	if !errors.As(err, &txErr) || len(txErr.Failures) == 0 {
		return false
	}
	for _, f := range txErr.Failures {
		if f.Service == nil {
			return false
		}
	}
	for _, f := range txErr.Failures {
		b.log.Warn("kernel rejected a service port; skipping it", "service", f.Service.String(), "op", f.What, "err", f.Err)
		skip[*f.Service] = fmt.Errorf("kernel rejected %s: %w", f.What, f.Err)
	}
	return true
}

func joinObjectErrors(errMaps ...map[model.ServicePortName]error) error {
	var errs []error
	for _, m := range errMaps {
		for _, n := range slices.SortedFunc(maps.Keys(m), compareNames) {
			errs = append(errs, &proxier.ObjectError{Service: n, Err: m[n]})
		}
	}
	return errors.Join(errs...)
}

func compareNames(a, b model.ServicePortName) int {
	return cmp.Or(
		cmp.Compare(a.Namespace, b.Namespace),
		cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Protocol, b.Protocol),
	)
}
