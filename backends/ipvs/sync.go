package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Sync makes the kernel match req. A full sync (req.Full, the first sync
// of the process, or after a failed operation) reads the kernel's IPVS
// table and the dummy interface once and converges them, adopting what an
// earlier process left; an incremental one applies the difference for the
// changed service ports, computed in memory.
func (b *backend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if req == nil || req.State == nil {
		return errors.New("ipvs: sync request without state")
	}
	if req.State.Family != 0 && req.State.Family != b.fi.fam {
		return fmt.Errorf("ipvs: %s backend got %s state", b.fi.fam, req.State.Family)
	}
	if b.nl == nil {
		return errors.New("ipvs: backend is closed")
	}
	start := b.now()
	full := req.Full || b.st == nil || b.dirty
	st, c, err := b.plan(req, full)
	if err != nil {
		b.dirty = true
		return err
	}
	var opErrs map[model.ServicePortName]error
	if full {
		opErrs, err = b.syncFull(ctx, st)
	} else {
		opErrs, err = b.syncIncremental(st, c)
	}
	if err != nil {
		b.dirty = true
		return err
	}
	b.st = st
	b.dirty = len(opErrs) > 0
	if err := b.drain(); err != nil {
		// Retried at the next sync; no reason to fail this one.
		b.log.Warn("graceful termination", "err", err)
	}
	b.log.Debug("sync", "full", full, "services", len(st.services), "virtualServers", len(st.vs), "took", b.now().Sub(start))
	return proxier.JoinObjectErrors(c.objErrs, opErrs)
}

// plan computes the state req asks for and, for an incremental sync, the
// change from the current one.
//
// The node's addresses (where node ports open) are read on full syncs and
// when the Node's addresses change: reading them means dumping every
// address of the namespace, the service addresses on the dummy interface
// included, which is work proportional to the number of services.
func (b *backend) plan(req *proxier.SyncRequest, full bool) (*state, *change, error) {
	var nodeAddrs []netip.Addr
	if full || b.st == nil || !slices.Equal(req.NodeIPs, b.nodeIPs) {
		var err error
		if nodeAddrs, err = b.links.nodeAddrs(b.fi.fam, b.cfg.NodePortAddresses); err != nil {
			return nil, nil, fmt.Errorf("ipvs: %w", err)
		}
		b.nodeIPs = slices.Clone(req.NodeIPs)
	} else {
		nodeAddrs = b.st.nodeAddrs
	}
	r := &renderer{fam: b.fi.fam, scheduler: b.cfg.Scheduler, nodeAddrs: nodeAddrs, affinityTO: model.DefaultAffinityTimeout, log: b.log, nodeIP: proxier.PrimaryNodeIP(b.cfg.Config, req, b.fi.fam)}
	st := b.st
	if full {
		st = newState()
	}
	c := planState(st, req, r, !full)
	return st, c, nil
}

// planState updates st to the state req asks for and returns the change.
// With incremental set it renders only the changed service ports (plus
// those with a node port when the node's addresses changed), so its work
// is proportional to the change; otherwise st must be empty and every
// service port is rendered. st is changed in place: after a failed sync
// the backend does a full one, which starts from an empty state.
func planState(st *state, req *proxier.SyncRequest, r *renderer, incremental bool) *change {
	c := &change{objErrs: map[model.ServicePortName]error{}}
	names := map[model.ServicePortName]bool{}
	if !incremental {
		for n := range req.State.Services {
			names[n] = true
		}
	} else {
		for n := range req.Changed {
			names[n] = true
		}
		if !slices.Equal(r.nodeAddrs, st.nodeAddrs) {
			// Node ports open on the new addresses.
			c.nodeChange = true
			for n, sp := range req.State.Services {
				if sp.NodePort != 0 {
					names[n] = true
				}
			}
			for n := range st.services {
				if sp := req.State.Services[n]; sp == nil || sp.NodePort != 0 {
					names[n] = true
				}
			}
		}
	}
	st.nodeAddrs = r.nodeAddrs
	sorted := slices.SortedFunc(maps.Keys(names), model.ServicePortName.Compare)
	// Release first, so that a virtual server moving from one service
	// port to another in this sync is no conflict.
	for _, n := range sorted {
		st.set(n, nil, c)
	}
	for _, n := range sorted {
		sp := req.State.Services[n]
		if sp == nil {
			continue
		}
		objs, err := r.render(sp, req.Targets[n])
		if err == nil {
			err = st.set(n, objs, c)
		}
		if err != nil {
			c.objErrs[n] = err
		}
	}
	c.normalize()
	return c
}

// syncFull converges the kernel to st.
func (b *backend) syncFull(ctx context.Context, st *state) (map[model.ServicePortName]error, error) {
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	link, err := b.links.ensure()
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	b.link = link
	bound, err := b.links.addrs(link, b.fi.fam)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	// What is ours: virtual servers recorded in our table, on our
	// interface's addresses, or programmed by this process.
	recorded, err := b.nft.virtualServers(&b.fi)
	if err != nil {
		return nil, fmt.Errorf("ipvs: read table %s: %w", b.cfg.TableName, err)
	}
	owned := map[vsKey]bool{}
	for _, k := range recorded {
		owned[k] = true
	}
	if b.st != nil {
		for k := range b.st.vs {
			owned[k] = true
		}
	}
	// The rules first: they record the new virtual servers as ours
	// before they exist, and reject what has no endpoints.
	t0 := b.now()
	elems := slices.SortedFunc(maps.Keys(st.elems), compareElems)
	if err := b.nft.replaceTable(&b.fi, &b.cfg, elems, b.log); err != nil {
		return nil, fmt.Errorf("ipvs: replace table %s: %w", b.cfg.TableName, err)
	}
	t1 := b.now()
	kvs, err := b.ipvs.list()
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	inKernel := map[vsKey]kernelVS{}
	for _, k := range kvs {
		inKernel[k.Key] = k
	}
	opErrs := map[model.ServicePortName]error{}
	fail := func(k vsKey, err error) {
		n := st.owner[k]
		opErrs[n] = errors.Join(opErrs[n], err)
	}
	for _, k := range slices.SortedFunc(maps.Keys(st.vs), compareKeys) {
		want := st.vs[k]
		have, ok := inKernel[k]
		if !ok {
			if err := b.createVS(want); err != nil {
				fail(k, err)
			}
			continue
		}
		if have.Sched != want.Sched || have.Timeout != want.Timeout {
			if err := b.ipvs.update(want); err != nil {
				fail(k, err)
				continue
			}
		}
		if err := b.convergeDests(want); err != nil {
			fail(k, err)
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(st.addrs), netip.Addr.Compare) {
		if _, found := slices.BinarySearchFunc(bound, a, netip.Addr.Compare); !found {
			if err := b.links.bind(link, a); err != nil {
				return opErrs, fmt.Errorf("ipvs: %w", err)
			}
		}
	}
	isBound := map[netip.Addr]bool{}
	for _, a := range bound {
		isBound[a] = true
		if st.addrs[a] == 0 {
			if err := b.links.unbind(link, a); err != nil {
				return opErrs, fmt.Errorf("ipvs: %w", err)
			}
		}
	}
	for _, k := range kvs {
		if _, want := st.vs[k.Key]; want || !(owned[k.Key] || isBound[k.Key.Addr]) {
			continue
		}
		if err := b.ipvs.remove(k.Key); err != nil {
			return opErrs, fmt.Errorf("ipvs: %w", err)
		}
		delete(b.draining, k.Key)
	}
	for k := range b.draining {
		if _, ok := st.vs[k]; !ok {
			delete(b.draining, k)
		}
	}
	b.log.Info("full sync", "services", len(st.services), "virtualServers", len(st.vs), "addresses", len(st.addrs),
		"elements", len(elems), "adopted", len(inKernel), "nftables", t1.Sub(t0), "ipvsAndAddresses", b.now().Sub(t1))
	return opErrs, nil
}

// createVS creates a virtual server with its real servers.
func (b *backend) createVS(s *vsSpec) error {
	if err := b.ipvs.create(s); err != nil {
		return err
	}
	delete(b.draining, s.Key)
	for _, d := range s.Dests {
		if err := b.ipvs.addDest(s.Key, d); err != nil {
			return err
		}
	}
	return nil
}

// convergeDests makes the real servers of an existing virtual server
// match s, reading them from the kernel.
func (b *backend) convergeDests(s *vsSpec) error {
	have, err := b.ipvs.dests(s.Key)
	if err != nil {
		return err
	}
	var errs []error
	seen := map[netip.AddrPort]bool{}
	for _, d := range have {
		seen[d.Addr] = true
		if _, want := slices.BinarySearchFunc(s.Dests, d.Addr, netip.AddrPort.Compare); want {
			if d.Weight != 1 {
				errs = append(errs, b.ipvs.setWeight(s.Key, d.Addr, 1))
			}
			b.undrain(s.Key, d.Addr)
			continue
		}
		errs = append(errs, b.retire(s.Key, d.Addr, d.Weight))
	}
	for _, d := range s.Dests {
		if !seen[d] {
			errs = append(errs, b.ipvs.addDest(s.Key, d))
			b.undrain(s.Key, d)
		}
	}
	return errors.Join(errs...)
}

// retire removes a real server that is no longer wanted: a TCP one drains
// with weight 0 (new connections go elsewhere, established ones go on)
// until [backend.drain] deletes it; others are deleted at once.
func (b *backend) retire(k vsKey, d netip.AddrPort, weight int) error {
	if k.Proto != model.TCP || b.cfg.GracefulTerminationTimeout < 0 {
		b.undrain(k, d)
		return b.ipvs.delDest(k, d)
	}
	if weight != 0 {
		if err := b.ipvs.setWeight(k, d, 0); err != nil {
			return err
		}
	}
	m := b.draining[k]
	if m == nil {
		m = map[netip.AddrPort]time.Time{}
		b.draining[k] = m
	}
	if _, ok := m[d]; !ok {
		m[d] = b.now().Add(b.cfg.GracefulTerminationTimeout)
	}
	return nil
}

func (b *backend) undrain(k vsKey, d netip.AddrPort) {
	if m := b.draining[k]; m != nil {
		delete(m, d)
		if len(m) == 0 {
			delete(b.draining, k)
		}
	}
}

// drain deletes draining real servers whose connections have ended or
// whose deadline has passed. It reads only the virtual servers that have
// some.
func (b *backend) drain() error {
	var errs []error
	now := b.now()
	for _, k := range slices.SortedFunc(maps.Keys(b.draining), compareKeys) {
		have, err := b.ipvs.dests(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		conns := map[netip.AddrPort]int{}
		for _, d := range have {
			conns[d.Addr] = d.Conns
		}
		for d, deadline := range b.draining[k] {
			n, ok := conns[d]
			switch {
			case !ok:
				b.undrain(k, d)
			case n == 0 || now.After(deadline):
				if err := b.ipvs.delDest(k, d); err != nil {
					errs = append(errs, err)
					continue
				}
				b.log.Debug("deleted drained real server", "virtualServer", k.String(), "realServer", d.String(), "connections", n)
				b.undrain(k, d)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("ipvs: graceful termination: %w", errors.Join(errs...))
	}
	return nil
}

// syncIncremental applies c; st is the state after it.
func (b *backend) syncIncremental(st *state, c *change) (map[model.ServicePortName]error, error) {
	if c.empty() {
		return nil, nil
	}
	if len(c.addElems) > 0 {
		if err := b.nft.updateElems(&b.fi, c.addElems, false); err != nil {
			return nil, fmt.Errorf("ipvs: add set elements: %w", err)
		}
	}
	opErrs := map[model.ServicePortName]error{}
	fail := func(s *vsSpec, err error) {
		opErrs[s.Owner] = errors.Join(opErrs[s.Owner], err)
	}
	for _, s := range c.newVS {
		if err := b.createVS(s); err != nil {
			fail(s, err)
		}
	}
	for _, u := range c.updateVS {
		if err := b.updateVS(u[0], u[1]); err != nil {
			fail(u[1], err)
		}
	}
	for _, a := range c.addAddrs {
		if err := b.links.bind(b.link, a); err != nil {
			return opErrs, fmt.Errorf("ipvs: %w", err)
		}
	}
	for _, a := range c.delAddrs {
		if err := b.links.unbind(b.link, a); err != nil {
			return opErrs, fmt.Errorf("ipvs: %w", err)
		}
	}
	for _, s := range c.delVS {
		if err := b.ipvs.remove(s.Key); err != nil {
			fail(s, err)
		}
		delete(b.draining, s.Key)
	}
	if len(c.delElems) > 0 {
		if err := b.nft.updateElems(&b.fi, c.delElems, true); err != nil {
			return opErrs, fmt.Errorf("ipvs: delete set elements: %w", err)
		}
	}
	return opErrs, nil
}

// updateVS changes a virtual server from old to s, from memory.
func (b *backend) updateVS(old, s *vsSpec) error {
	if !old.sameService(s) {
		if err := b.ipvs.update(s); err != nil {
			return err
		}
	}
	var errs []error
	for _, d := range s.Dests {
		if _, had := slices.BinarySearchFunc(old.Dests, d, netip.AddrPort.Compare); !had {
			errs = append(errs, b.ipvs.addDest(s.Key, d))
			b.undrain(s.Key, d)
		}
	}
	for _, d := range old.Dests {
		if _, keep := slices.BinarySearchFunc(s.Dests, d, netip.AddrPort.Compare); !keep {
			errs = append(errs, b.retire(s.Key, d, 1))
		}
	}
	return errors.Join(errs...)
}
