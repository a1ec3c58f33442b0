package ebpf

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// localPortRangeFile is the node's ephemeral port range, read in its
// network namespace.
const localPortRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// minSNATPorts is the fewest ports the default SNAT range may have.
const minSNATPorts = 1024

// readLocalPortRange reads the ephemeral port range of the calling
// thread's network namespace.
func readLocalPortRange() ([2]uint16, error) {
	b, err := os.ReadFile(localPortRangeFile)
	if err != nil {
		return [2]uint16{}, err
	}
	var lo, hi uint16
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return [2]uint16{}, fmt.Errorf("%s: %q: %w", localPortRangeFile, b, err)
	}
	return [2]uint16{lo, hi}, nil
}

// snatPorts returns the source port range of the flows the tc and XDP
// programs SNAT: Config.NorthSouthSNATPorts, or by default the widest
// run of ports from 1024 to 65535 outside local, the node's ephemeral
// range (1024-32767 with Linux's default 32768-60999), so that the
// node's own connections never pick a port a SNATed flow holds. A
// client's ephemeral ports map one to one onto a range at least as
// wide as its ephemeral range (see own_port in bpf/nodeport.h).
func (c *Config) snatPorts(local [2]uint16) (lo, hi uint16, err error) {
	lo, hi = c.NorthSouthSNATPorts[0], c.NorthSouthSNATPorts[1]
	if lo != 0 || hi != 0 {
		if lo == 0 || hi < lo {
			return 0, 0, fmt.Errorf("ebpf: Config.NorthSouthSNATPorts %d-%d is not a range of ports (want first <= last, both 1-65535)", lo, hi)
		}
		return lo, hi, nil
	}
	below := [2]int{1024, int(local[0]) - 1}
	above := [2]int{int(local[1]) + 1, 65535}
	best := below
	if above[1]-above[0] > best[1]-best[0] {
		best = above
	}
	if best[1]-best[0]+1 < minSNATPorts {
		return 0, 0, fmt.Errorf("ebpf: the node's ephemeral ports (%s %d-%d) leave fewer than %d ports from 1024 for SNATed north-south flows; set Config.NorthSouthSNATPorts", localPortRangeFile, local[0], local[1], minSNATPorts)
	}
	return uint16(best[0]), uint16(best[1]), nil
}

// setSNATPorts writes the SNAT port range into bpf/nodeport.h's
// load-time constants.
func setSNATPorts(spec *ebpf.CollectionSpec, ports [2]uint16) error {
	for name, v := range map[string]uint16{"snat_port_min": ports[0], "snat_port_max": ports[1]} {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("ebpf: bpf/nodeport.h lacks variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("ebpf: %s: %w", name, err)
		}
	}
	return nil
}

// Kernel representations of the frontend and endpoint maps of
// bpf/nodeport.c (TestNodeportMapLayout checks them against the
// object's BTF). Addresses are 16 bytes, IPv4-mapped for IPv4, so that
// both families share the maps.

type nsfeKey struct {
	Addr  [16]byte
	Port  [2]byte
	Proto uint8
	Pad   uint8
}

type nsfeVal struct {
	ID          uint32
	Count       uint32
	Flags       uint32
	AffinitySec uint32
}

// Flags of nsfeVal.
const (
	// nsfeDrop: endpoints exist, none for this traffic on this node
	// (externalTrafficPolicy Local).
	nsfeDrop = 1
	// nsfeLocal: externalTrafficPolicy Local, never SNAT.
	nsfeLocal = 2
	// nsfeRanges: a load-balancer IP with source ranges (pk_nsrange).
	nsfeRanges = 4
	// nsfeDSR: a flow to a remote endpoint goes by direct server
	// return (Forwarding).
	nsfeDSR = 8
	// nsfeMaglev: a new flow picks with the group's Maglev table
	// (pk_nsmag).
	nsfeMaglev = 16
)

// nslocKey is a key of pk_nsloc: an endpoint of this node, to which
// packets wrapped for direct server return are unwrapped.
type nslocKey struct {
	Addr [16]byte
	Port [2]byte
	Pad  uint16
}

// nsrangeKey is a key of pk_nsrange: a source prefix admitted to the
// load-balancer IPs of group ID. Prefixlen counts the id's 32 bits and
// the address's (IPv4-mapped for IPv4).
type nsrangeKey struct {
	Prefixlen uint32
	ID        uint32
	Addr      [16]byte
}

// rangeKey returns the pk_nsrange key of prefix p of group id.
func rangeKey(id uint32, p netip.Prefix) nsrangeKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return nsrangeKey{Prefixlen: 32 + uint32(bits), ID: id, Addr: mapped16(p.Addr())}
}

type nsbeVal struct {
	Addr  [16]byte
	Port  [2]byte
	Flags uint16
}

// nsbeLocal marks an endpoint on this node: its flows are not SNATed.
const nsbeLocal = 1

// v6GroupBit is set in the group ids of the IPv6 backend, so that the
// two family backends, which share pk_nsbe, never use the same id.
const v6GroupBit = 1 << 31

// tcBackend is the north-south part of one family with NorthSouth tc:
// it stands where the composed nftables backend would, and keeps the
// tc plane's frontend and endpoint maps of its family in step with the
// requests.
type tcBackend struct {
	plane  *tcPlane
	family model.IPFamily
	log    *slog.Logger
	ids    idAllocator
	// groups are the endpoint groups of the service ports, by name and
	// role: kept across syncs so that ids and slots stay put.
	groups map[groupName]*nsGroup
	// st is what the maps hold of this family as of the last
	// successful sync; nil when unknown.
	st *nsState
	// ports are the keys of st each service port holds, so that a sync
	// that is not Full renders and writes the Changed ones alone.
	ports map[model.ServicePortName]*portKeys
	// badMode are the service ports whose unknown ForwardingMode was
	// logged.
	badMode map[model.ServicePortName]bool
	// rows builds and writes the Maglev tables of pk_nsmag.
	rows *rowWriter
	// gen counts the full renders, so that one finds the groups it did
	// not lay out.
	gen uint64
	// nodeIP is the node's primary address the ranges were rendered
	// with: ranges holding it admit the load-balancer IPs as sources.
	nodeIP netip.Addr
}

// portKeys are the entries of the maps one service port holds: its
// frontends, the ids of its groups that hold slots, its source ranges
// and the ids of its Maglev tables.
type portKeys struct {
	fes    []nsfeKey
	groups []uint32
	ranges []nsrangeKey
	tables []uint32
}

var _ proxier.Backend = (*tcBackend)(nil)

// groupName names one of a service port's endpoint groups.
type groupName struct {
	name model.ServicePortName
	role groupRole
}

// groupRole says which traffic of a service port an endpoint group
// receives.
type groupRole uint8

const (
	// roleInternal: cluster IP traffic.
	roleInternal groupRole = iota
	// roleExternal: node port, external and load-balancer IP traffic.
	roleExternal
	// roleShort: what pods send to the external frontends of an
	// externalTrafficPolicy Local service where their packets reach
	// tc untranslated (kube-proxy's short circuit; nsfeKeyShort).
	roleShort
	// numGroupRoles counts the roles.
	numGroupRoles
)

// nsfeKeyShort is the Pad of a frontend's key whose entry holds its
// short circuit (bpf/nodeport.h NSFE_KEY_SHORT).
const nsfeKeyShort = 1

// nsGroup is an endpoint group, in slot order.
type nsGroup struct {
	id  uint32
	eps []netip.AddrPort
	// gen is the tcBackend's gen when the group was last laid out.
	gen uint64
}

// nsState is the contents of the maps of one family.
type nsState struct {
	fes map[nsfeKey]nsfeVal
	// slots are the endpoint slots of pk_nsbe by group id: slot i of a
	// group at index i of its row. A group without slots has no row.
	// One entry per group, not per slot: a full sync of 1 M slots spent
	// most of its time inserting them one by one into a Go map.
	slots map[uint32][]nsbeVal
	// gaps, only in a state read from the kernel, mark the slots of a
	// row that pk_nsbe lacks (true), for the rows that have any.
	gaps map[uint32][]bool
	// stray are the keys of pk_nsbe (read from the kernel) whose slot
	// no row can hold (beyond MaxBackends): they are always deleted.
	stray []beKey
	// nslots counts the slots the rows hold (without gaps).
	nslots int
	// arena is where new rows are cut from (render sizes it), and
	// cuts the ids of the rows cut, in order.
	arena  []nsbeVal
	cuts   []uint32
	ranges map[nsrangeKey]uint8
	// locals count the local slots of each endpoint of this node, which
	// pk_nsloc holds (read from the kernel: 1 each).
	locals map[nslocKey]int
	// tables are the Maglev tables of pk_nsmag by group id.
	tables map[uint32]nsTable
}

// nsTable is a Maglev table of pk_nsmag: the endpoints it was built
// from, or (read from the kernel) its fingerprint.
type nsTable struct {
	eps []netip.AddrPort
	sum uint64
}

func newNSState() *nsState { return newNSStateSized(0, 0, 0) }

// newNSStateSized returns an empty state with room for fes frontends,
// groups rows of slots and slots slots in all.
func newNSStateSized(fes, groups, slots int) *nsState {
	return &nsState{fes: make(map[nsfeKey]nsfeVal, fes), slots: make(map[uint32][]nsbeVal, groups), arena: make([]nsbeVal, 0, slots),
		ranges: map[nsrangeKey]uint8{}, locals: map[nslocKey]int{}, tables: map[uint32]nsTable{}}
}

// newRow returns a row of n slots for group id, cut from the arena while
// it has room.
func (st *nsState) newRow(id uint32, n int) []nsbeVal {
	if n > cap(st.arena)-len(st.arena) {
		return make([]nsbeVal, n)
	}
	if n > 0 {
		st.cuts = append(st.cuts, id)
	}
	l := len(st.arena)
	st.arena = st.arena[:l+n]
	return st.arena[l : l+n : l+n]
}

// arenaKeys returns the keys of every slot of st in arena order, when
// st's rows are exactly those cut from its arena, each set once (a
// full render's): st.arena then holds their values, in the same order.
func (st *nsState) arenaKeys() ([]beKey, bool) {
	if st.nslots != len(st.arena) || len(st.slots) != len(st.cuts) || st.gaps != nil {
		return nil, false
	}
	keys := make([]beKey, 0, len(st.arena))
	for _, id := range st.cuts {
		row := st.slots[id]
		n := len(keys)
		if len(row) == 0 || len(row) > len(st.arena)-n || &row[0] != &st.arena[n] {
			return nil, false
		}
		for i := range row {
			keys = append(keys, beKey{ID: id, Slot: uint32(i)})
		}
	}
	return keys, len(keys) == len(st.arena)
}

// setRow makes row (no gaps) the slots of group id; an empty row
// drops the group's.
func (st *nsState) setRow(id uint32, row []nsbeVal) {
	st.dropRow(id)
	if len(row) > 0 {
		st.slots[id] = row
		st.nslots += len(row)
	}
}

// dropRow removes the slots of group id.
func (st *nsState) dropRow(id uint32) {
	row, ok := st.slots[id]
	if !ok {
		return
	}
	st.nslots -= len(row)
	if g, ok := st.gaps[id]; ok {
		for _, gap := range g {
			if gap {
				st.nslots++
			}
		}
		delete(st.gaps, id)
	}
	delete(st.slots, id)
}

// slot returns slot s of group id, and whether st holds it.
func (st *nsState) slot(id, s uint32) (nsbeVal, bool) {
	row := st.slots[id]
	if int64(s) >= int64(len(row)) || st.gaps[id] != nil && st.gaps[id][s] {
		return nsbeVal{}, false
	}
	return row[s], true
}

// slotReader builds the rows of a state from the slots of pk_nsbe,
// which a read returns in any order: one Go map lookup a slot, in a map
// of one entry a group.
type slotReader struct {
	st    *nsState
	limit int
	rows  map[uint32]*slotRow
	// vals and has are where rows are cut from.
	vals []nsbeVal
	has  []bool
}

// slotRow is a row being read: has marks the slots read, n counts them.
type slotRow struct {
	vals []nsbeVal
	has  []bool
	n    int
}

// newSlotReader returns a reader of the slots of st, whose frontends
// (read first) size the rows of their groups. A slot at or beyond limit
// goes to st.stray.
func newSlotReader(st *nsState, limit int) *slotReader {
	r := &slotReader{st: st, limit: limit, rows: make(map[uint32]*slotRow, len(st.fes))}
	for _, v := range st.fes {
		if _, ok := r.rows[v.ID]; !ok && v.Count > 0 && int64(v.Count) <= int64(limit) {
			row := &slotRow{}
			row.vals, row.has = r.cut(int(v.Count))
			r.rows[v.ID] = row
		}
	}
	return r
}

// cut returns n zero slots and n false marks.
func (r *slotReader) cut(n int) ([]nsbeVal, []bool) {
	if n > cap(r.vals)-len(r.vals) {
		size := max(n, 1<<14)
		r.vals, r.has = make([]nsbeVal, 0, size), make([]bool, 0, size)
	}
	l := len(r.vals)
	r.vals, r.has = r.vals[:l+n], r.has[:l+n]
	return r.vals[l : l+n : l+n], r.has[l : l+n : l+n]
}

// add adds slot k with value v.
func (r *slotReader) add(k beKey, v nsbeVal) {
	if int64(k.Slot) >= int64(r.limit) {
		r.st.stray = append(r.st.stray, k)
		return
	}
	row := r.rows[k.ID]
	if row == nil {
		row = &slotRow{}
		r.rows[k.ID] = row
	}
	s := int(k.Slot)
	for len(row.vals) <= s {
		row.vals, row.has = append(row.vals, nsbeVal{}), append(row.has, false)
	}
	if row.has[s] {
		return // a key twice: the map holds one
	}
	row.vals[s], row.has[s] = v, true
	row.n++
}

// finish puts the rows read into st: without the slots missing at their
// end, with gaps for those missing before.
func (r *slotReader) finish() {
	st := r.st
	for id, row := range r.rows {
		if row.n == 0 {
			continue
		}
		end := len(row.vals)
		for !row.has[end-1] {
			end--
		}
		st.slots[id] = row.vals[:end:end]
		st.nslots += row.n
		if row.n < end {
			if st.gaps == nil {
				st.gaps = map[uint32][]bool{}
			}
			gaps := make([]bool, end)
			for i, h := range row.has[:end] {
				gaps[i] = !h
			}
			st.gaps[id] = gaps
		}
	}
	r.rows = nil
}

// diffSlots returns the slots of want that have lacks or holds
// differently, and the keys of the slots have holds and want does not
// (want has no gaps).
func diffSlots(have, want *nsState) (putK []beKey, putV []nsbeVal, del []beKey) {
	if len(have.slots) == 0 {
		// Every slot of want is written (a first sync): the values
		// are written from the arena want's rows were cut from.
		if keys, ok := want.arenaKeys(); ok {
			return keys, want.arena, slices.Clone(have.stray)
		}
	}
	if n := want.nslots - have.nslots; n > 0 {
		putK, putV = make([]beKey, 0, n), make([]nsbeVal, 0, n)
	}
	for id, w := range want.slots {
		h, gaps := have.slots[id], have.gaps[id]
		for i, v := range w {
			if i < len(h) && (gaps == nil || !gaps[i]) && h[i] == v {
				continue
			}
			putK, putV = append(putK, beKey{ID: id, Slot: uint32(i)}), append(putV, v)
		}
	}
	for id, h := range have.slots {
		gaps := have.gaps[id]
		for i := len(want.slots[id]); i < len(h); i++ {
			if gaps == nil || !gaps[i] {
				del = append(del, beKey{ID: id, Slot: uint32(i)})
			}
		}
	}
	return putK, putV, append(del, have.stray...)
}

// tableOpsNS returns the Maglev tables that turn have's into want's: the
// groups whose table is written (new, or built from other endpoints) and
// the ids whose table is deleted.
func (t *tcBackend) tableOpsNS(have, want *nsState) (put []*group, del []uint32) {
	for id, w := range want.tables {
		h, ok := have.tables[id]
		switch {
		case ok && h.eps != nil && slices.Equal(h.eps, w.eps):
			continue
		case ok && h.eps == nil && h.sum == tableSum(t.rows.seed, maglevTable(w.eps, t.rows.m, nil)):
			continue
		}
		put = append(put, &group{id: id, eps: w.eps})
	}
	for id := range have.tables {
		if _, ok := want.tables[id]; !ok {
			del = append(del, id)
		}
	}
	return put, del
}

// addLocals adds sign for each local slot of st (which has no gaps) to
// counts.
func addLocals(counts map[nslocKey]int, st *nsState, sign int) {
	for _, row := range st.slots {
		for _, v := range row {
			if v.Flags&nsbeLocal != 0 {
				counts[nslocKey{Addr: v.Addr, Port: v.Port}] += sign
			}
		}
	}
}

// presence returns the keys want holds and have does not (put), and
// those have holds and want does not (del).
func presence(have, want map[nslocKey]int) (put, del []nslocKey) {
	for k, n := range want {
		if n > 0 && have[k] <= 0 {
			put = append(put, k)
		}
	}
	for k, n := range have {
		if n > 0 && want[k] <= 0 {
			del = append(del, k)
		}
	}
	return put, del
}

// newTCBackend returns the north-south backend of family on plane,
// holding a reference to it.
func newTCBackend(plane *tcPlane, family model.IPFamily, log *slog.Logger) *tcBackend {
	plane.acquire()
	return &tcBackend{plane: plane, family: family, log: log.With("part", "tc"), groups: map[groupName]*nsGroup{},
		badMode: map[model.ServicePortName]bool{}, rows: newRowWriter(plane.cfg.MaglevTableSize, maphash.MakeSeed())}
}

// Name returns "ebpf-tc".
func (t *tcBackend) Name() string { return "ebpf-tc" }

// Family returns the backend's IP family.
func (t *tcBackend) Family() model.IPFamily { return t.family }

// Sync makes the family's frontends and endpoint slots match req, then
// attaches the programs to interfaces that appeared and writes the
// interfaces' addresses. A sync that is not Full, after a successful
// one, renders and writes the Changed service ports alone.
func (t *tcBackend) Sync(ctx context.Context, req *proxier.SyncRequest) error {
	return t.syncSorted(ctx, req, func() []namedPort { return sortedServices(req) })
}

// syncSorted is Sync, with the service ports of req in name order from
// sorted (sortedServices) when it renders them all.
func (t *tcBackend) syncSorted(ctx context.Context, req *proxier.SyncRequest, sorted func() []namedPort) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.plane == nil {
		return errClosed
	}
	// Ranges depend on the node's address: a change (rare) renders
	// every service port.
	nodeIP := proxier.PrimaryNodeIP(t.plane.cfg.Config, req, t.family)
	same := nodeIP == t.nodeIP
	t.nodeIP = nodeIP
	if t.st != nil && !req.Full && req.Changed != nil && same {
		objErrs, err := t.syncChanged(req)
		if err != nil {
			t.st = nil
			return err
		}
		return errors.Join(t.plane.refresh(), proxier.JoinObjectErrors(objErrs))
	}
	want, ports, objErrs := t.render(req, sorted())
	have := t.st
	if have == nil || req.Full {
		var err error
		if have, err = t.readKernel(); err != nil {
			t.st = nil
			return err
		}
	}
	putL, delL := presence(have.locals, want.locals)
	if err := t.write(have, want, putL, delL); err != nil {
		t.st = nil
		return err
	}
	t.st, t.ports = want, ports
	return errors.Join(t.plane.refresh(), proxier.JoinObjectErrors(objErrs))
}

// fits reports whether fes frontends and slots endpoint slots, all of
// the family, fit the maps, and else says which map they overflow: the
// family's share of pk_nsfe is MaxServices, of pk_nsbe MaxBackends.
func (t *tcBackend) fits(fes, slots int) error {
	cfg := &t.plane.cfg
	if fes > cfg.MaxServices {
		return &MapFullError{Map: mapNSFe, Field: "MaxServices", Size: cfg.MaxServices}
	}
	if slots > cfg.MaxBackends {
		return &MapFullError{Map: mapNSBe, Field: "MaxBackends", Size: cfg.MaxBackends}
	}
	return nil
}

// portPlan is what a service port holds at tc: its frontends and the
// distinct endpoints of the groups they use (internal, external),
// computed once to admit the port and to render it.
type portPlan struct {
	internal, external, ranged []nsfeKey
	// short are the keys of the short circuit (roleShort).
	short []nsfeKey
	// eps are the distinct endpoints of each groupRole.
	eps [numGroupRoles][]netip.AddrPort
}

// size returns the frontends and endpoint slots the plan holds.
func (p *portPlan) size() (fes, slots int) {
	return len(p.internal) + len(p.external) + len(p.ranged) + len(p.short), len(p.eps[roleInternal]) + len(p.eps[roleExternal]) + len(p.eps[roleShort])
}

// plan returns the plan of service port sp with targets tg.
func (t *tcBackend) plan(sp *model.ServicePort, tg *proxier.Targets) *portPlan {
	p := &portPlan{}
	p.internal, p.external, p.ranged = tcFrontends(t.family, sp)
	if len(p.internal) > 0 {
		p.eps[roleInternal] = addrs(tg.Internal)
	}
	if len(p.external) > 0 || len(p.ranged) > 0 {
		p.eps[roleExternal] = addrs(tg.External)
	}
	if sp.ExternalLocal() {
		// Pods' packets reach tc untranslated for load-balancer
		// IPs with source ranges (the socket programs pass them)
		// and for SCTP (which no socket program sees).
		short := func(k nsfeKey) {
			k.Pad = nsfeKeyShort
			p.short = append(p.short, k)
		}
		for _, k := range p.ranged {
			short(k)
		}
		if sp.Protocol == model.SCTP {
			for _, k := range p.external {
				short(k)
			}
		}
		if len(p.short) > 0 {
			p.eps[roleShort] = addrs(tg.ShortCircuit())
		}
	}
	return p
}

// leave forgets the groups of service port name, which the maps do not
// hold, and returns its error.
func (t *tcBackend) leave(name model.ServicePortName, err error) error {
	t.forget(name)
	return fmt.Errorf("ebpf: tc: %w", err)
}

// forget drops the groups of service port name.
func (t *tcBackend) forget(name model.ServicePortName) {
	for r := range numGroupRoles {
		delete(t.groups, groupName{name, r})
	}
}

// syncChanged renders the Changed service ports of req, writes the
// difference to what they held, and updates st and ports. A port that
// does not fit the maps is left out with an ObjectError.
func (t *tcBackend) syncChanged(req *proxier.SyncRequest) (map[model.ServicePortName]error, error) {
	have, want := newNSState(), newNSState()
	next := make(map[model.ServicePortName]*portKeys, len(req.Changed))
	held := [2]int{len(t.st.fes), t.st.nslots}
	for name := range req.Changed {
		if old := t.ports[name]; old != nil {
			for _, k := range old.fes {
				have.fes[k] = t.st.fes[k]
			}
			for _, id := range old.groups {
				have.setRow(id, t.st.slots[id])
				held[1] -= len(t.st.slots[id])
			}
			for _, k := range old.ranges {
				have.ranges[k] = t.st.ranges[k]
			}
			for _, id := range old.tables {
				have.tables[id] = t.st.tables[id]
			}
			held[0] -= len(old.fes)
		}
	}
	objErrs := map[model.ServicePortName]error{}
	for _, name := range slices.SortedFunc(maps.Keys(req.Changed), model.ServicePortName.Compare) {
		next[name] = nil
		sp := req.State.Services[name]
		if sp == nil {
			t.forget(name)
			delete(t.badMode, name)
			continue
		}
		tg := targetsOrNone(req.Targets[name])
		p := t.plan(sp, tg)
		fes, slots := p.size()
		if err := t.fits(held[0]+fes, held[1]+slots); err != nil {
			objErrs[name] = t.leave(name, err)
			continue
		}
		held[0] += fes
		held[1] += slots
		next[name] = t.renderPort(want, name, sp, tg, p)
	}
	// Endpoints of this node may serve several service ports: their
	// pk_nsloc entries follow the count of local slots over all.
	delta := maps.Clone(want.locals)
	addLocals(delta, have, -1)
	var putL, delL []nslocKey
	for k, d := range delta {
		old := t.st.locals[k]
		switch n := old + d; {
		case old <= 0 && n > 0:
			putL = append(putL, k)
		case old > 0 && n <= 0:
			delL = append(delL, k)
		}
	}
	if err := t.write(have, want, putL, delL); err != nil {
		return nil, err
	}
	for k, d := range delta {
		if n := t.st.locals[k] + d; n > 0 {
			t.st.locals[k] = n
		} else {
			delete(t.st.locals, k)
		}
	}
	for name := range next {
		if old := t.ports[name]; old != nil {
			for _, k := range old.fes {
				delete(t.st.fes, k)
			}
			for _, id := range old.groups {
				t.st.dropRow(id)
			}
			for _, k := range old.ranges {
				delete(t.st.ranges, k)
			}
			for _, id := range old.tables {
				delete(t.st.tables, id)
			}
		}
	}
	maps.Copy(t.st.fes, want.fes)
	for id, row := range want.slots {
		t.st.setRow(id, row)
	}
	maps.Copy(t.st.ranges, want.ranges)
	maps.Copy(t.st.tables, want.tables)
	for name, pk := range next {
		if pk == nil {
			delete(t.ports, name)
		} else {
			t.ports[name] = pk
		}
	}
	return objErrs, nil
}

// render computes the family's map contents from the whole state of
// req, and the keys each service port holds. Service ports are admitted
// in name order; one that does not fit the maps is left out with an
// ObjectError. names are the service ports of req in name order
// (sortedServices).
func (t *tcBackend) render(req *proxier.SyncRequest, names []namedPort) (*nsState, map[model.ServicePortName]*portKeys, map[model.ServicePortName]error) {
	type planned struct {
		tg *proxier.Targets
		p  *portPlan
	}
	plans := make([]planned, len(names))
	var allFEs, allGroups, allSlots int
	for i, np := range names {
		tg := targetsOrNone(np.tg)
		plans[i] = planned{tg, t.plan(np.sp, tg)}
		fes, slots := plans[i].p.size()
		allFEs += fes
		allSlots += slots
		for _, eps := range plans[i].p.eps {
			allGroups += min(len(eps), 1)
		}
	}
	st := newNSStateSized(allFEs, allGroups, allSlots)
	if len(t.groups) == 0 {
		t.groups = make(map[groupName]*nsGroup, allGroups)
	}
	ports := make(map[model.ServicePortName]*portKeys, len(req.State.Services))
	objErrs := map[model.ServicePortName]error{}
	t.gen++
	for i, np := range names {
		pl := &plans[i]
		fes, slots := pl.p.size()
		if err := t.fits(len(st.fes)+fes, st.nslots+slots); err != nil {
			objErrs[np.name] = t.leave(np.name, err)
			continue
		}
		ports[np.name] = t.renderPort(st, np.name, np.sp, pl.tg, pl.p)
	}
	// The groups this render did not lay out belong to service ports
	// that are gone or left out.
	for gn, g := range t.groups {
		if g.gen != t.gen {
			delete(t.groups, gn)
		}
	}
	for name := range t.badMode {
		if _, ok := req.State.Services[name]; !ok {
			delete(t.badMode, name)
		}
	}
	return st, ports, objErrs
}

// renderPort adds the frontends, slots and source ranges of service
// port name to st and returns their keys. A group the port no longer
// uses is forgotten.
func (t *tcBackend) renderPort(st *nsState, name model.ServicePortName, sp *model.ServicePort, tg *proxier.Targets, p *portPlan) *portKeys {
	fes, _ := p.size()
	pk := &portKeys{fes: make([]nsfeKey, 0, fes)}
	ranged := p.ranged
	for _, role := range []struct {
		role groupRole
		fes  []nsfeKey
		eps  []*model.Endpoint
		want []netip.AddrPort
	}{
		{roleInternal, p.internal, tg.Internal, p.eps[roleInternal]},
		{roleExternal, p.external, tg.External, p.eps[roleExternal]},
		{roleShort, p.short, tg.ShortCircuit(), p.eps[roleShort]},
	} {
		external := role.role == roleExternal
		gn := groupName{name, role.role}
		if len(role.fes) == 0 && (!external || len(ranged) == 0) {
			delete(t.groups, gn)
			continue
		}
		g := t.group(gn, role.want)
		v := t.renderGroup(st, g, role.eps)
		if v.Count > 0 {
			pk.groups = append(pk.groups, v.ID)
		}
		v.AffinitySec = affinitySec(sp)
		if external && sp.ExternalLocal() {
			v.Flags |= nsfeLocal
		}
		if external && !sp.ExternalLocal() && t.dsr(name, sp) {
			v.Flags |= nsfeDSR
		}
		if t.maglev(sp) && len(g.eps) > 0 && len(g.eps) <= t.rows.m {
			v.Flags |= nsfeMaglev
			st.tables[g.id] = nsTable{eps: slices.Clone(g.eps)}
			pk.tables = append(pk.tables, g.id)
		}
		if v.Count == 0 && tg.HasEndpoints {
			v.Flags |= nsfeDrop
		}
		for _, k := range role.fes {
			st.fes[k] = v
			pk.fes = append(pk.fes, k)
		}
		if !external || len(ranged) == 0 {
			continue
		}
		v.Flags |= nsfeRanges
		for _, k := range ranged {
			st.fes[k] = v
			pk.fes = append(pk.fes, k)
		}
		add := func(r netip.Prefix) {
			k := rangeKey(v.ID, r)
			if _, ok := st.ranges[k]; !ok {
				st.ranges[k] = 0
				pk.ranges = append(pk.ranges, k)
			}
		}
		for _, r := range sp.LoadBalancerSourceRanges {
			if r.IsValid() && t.family.Contains(r.Addr()) {
				add(r)
			}
		}
		// kube-proxy admits the load-balancer IPs themselves as
		// sources (a node reaching its VIP from the VIP) when the
		// ranges hold the node's primary address.
		if sp.SourceRangesHold(t.nodeIP) {
			for _, k := range ranged {
				a := netip.AddrFrom16(k.Addr).Unmap()
				add(netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return pk
}

// renderGroup adds the slots of g to st and returns the value of its
// frontends. eps are the targets g was laid out from: they say which
// endpoints run on this node.
func (t *tcBackend) renderGroup(st *nsState, g *nsGroup, eps []*model.Endpoint) nsfeVal {
	// Small groups (nearly all) scan eps instead of building a map.
	var local map[netip.AddrPort]bool
	if len(eps) > 16 {
		local = make(map[netip.AddrPort]bool, len(eps))
		for _, e := range eps {
			local[e.Addr] = local[e.Addr] || e.Local
		}
	}
	isLocal := func(ep netip.AddrPort) bool {
		if local != nil {
			return local[ep]
		}
		for _, e := range eps {
			if e.Local && e.Addr == ep {
				return true
			}
		}
		return false
	}
	row := st.newRow(g.id, len(g.eps))
	for i, ep := range g.eps {
		v := nsbeVal{Addr: mapped16(ep.Addr()), Port: be16(ep.Port())}
		if isLocal(ep) {
			v.Flags = nsbeLocal
			st.locals[nslocKey{Addr: v.Addr, Port: v.Port}]++
		}
		row[i] = v
	}
	st.setRow(g.id, row)
	return nsfeVal{ID: g.id, Count: uint32(len(g.eps))}
}

// group returns the endpoint group gn holding the distinct endpoints
// want, keeping the id and the slots of endpoints that stay.
func (t *tcBackend) group(gn groupName, want []netip.AddrPort) *nsGroup {
	g := t.groups[gn]
	if g == nil {
		id, _ := t.ids.alloc() // 2^31 ids per process: never exhausted in practice
		if t.family == model.IPv6 {
			id |= v6GroupBit
		}
		g = &nsGroup{id: id}
		t.groups[gn] = g
	}
	if len(g.eps) == 0 {
		g.eps = want // the plan's own slice: layout would copy it
	} else {
		g.eps = layout(g.eps, want)
	}
	g.gen = t.gen
	return g
}

// tcFrontends returns the frontends of sp served at tc, for TCP, UDP
// and SCTP: the cluster IP (internal: packets that reach the node for
// it from outside or from a pod's socket, which no socket program saw
// or translated: every SCTP one), the node port on every
// node address, external IPs and load-balancer IPs of the family
// (external), and apart the load-balancer IPs with source ranges
// (ranged, which serve the external endpoints too).
func tcFrontends(f model.IPFamily, sp *model.ServicePort) (internal, external, ranged []nsfeKey) {
	proto := sp.Protocol.Number()
	if proto == 0 {
		return nil, nil, nil
	}
	key := func(a netip.Addr, port uint16) nsfeKey {
		return nsfeKey{Addr: mapped16(a), Port: be16(port), Proto: proto}
	}
	if f.Contains(sp.ClusterIP) {
		internal = append(internal, key(sp.ClusterIP.Unmap(), sp.Port))
	}
	if sp.NodePort != 0 {
		external = append(external, key(unspecified(f), sp.NodePort))
	}
	for _, ip := range sp.ExternalIPs {
		if f.Contains(ip) {
			external = append(external, key(ip.Unmap(), sp.Port))
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if !f.Contains(ip) {
			continue
		}
		if len(sp.LoadBalancerSourceRanges) > 0 {
			ranged = append(ranged, key(ip.Unmap(), sp.Port))
		} else {
			external = append(external, key(ip.Unmap(), sp.Port))
		}
	}
	return internal, external, ranged
}

// readKernel reads the entries of the backend's family from the maps.
func (t *tcBackend) readKernel() (*nsState, error) {
	st := newNSState()
	err := readAll(t.plane.objs.PkNsfe, func(k nsfeKey, v nsfeVal) {
		if familyOf(k.Addr) == t.family {
			st.fes[k] = v
		}
	})
	if err == nil {
		r := newSlotReader(st, t.plane.cfg.MaxBackends)
		err = readAll(t.plane.objs.PkNsbe, func(k beKey, v nsbeVal) {
			if (k.ID&v6GroupBit != 0) == (t.family == model.IPv6) {
				r.add(k, v)
			}
		})
		r.finish()
	}
	if err == nil {
		err = t.readRanges(st)
	}
	if err == nil {
		err = t.rows.scan(t.plane.objs.PkNsmag, func(id uint32, row []uint32) {
			if (id&v6GroupBit != 0) == (t.family == model.IPv6) {
				st.tables[id] = nsTable{sum: tableSum(t.rows.seed, row)}
			}
		})
	}
	if err == nil {
		err = readAll(t.plane.objs.PkNsloc, func(k nslocKey, _ uint8) {
			if familyOf(k.Addr) == t.family {
				st.locals[k] = 1
			}
		})
	}
	if err != nil {
		return nil, fmt.Errorf("ebpf: tc: %w", err)
	}
	return st, nil
}

// readRanges reads the family's entries of pk_nsrange (an LPM trie,
// which has no batch lookup) into st.
func (t *tcBackend) readRanges(st *nsState) error {
	var k nsrangeKey
	var v uint8
	it := t.plane.objs.PkNsrange.Iterate()
	for it.Next(&k, &v) {
		if (k.ID&v6GroupBit != 0) == (t.family == model.IPv6) {
			st.ranges[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", mapNSRange, err)
	}
	return nil
}

// write turns the maps' contents have into want: new slots, then
// frontends, then removed frontends, then removed slots, so that a
// frontend never counts a slot that is not there. putL and delL are the
// endpoints of this node that pk_nsloc gains and loses.
func (t *tcBackend) write(have, want *nsState, putL, delL []nslocKey) error {
	putFK, putFV, delF := diffMaps(have.fes, want.fes)
	putBK, putBV, delB := diffSlots(have, want)
	putRK, _, delR := diffMaps(have.ranges, want.ranges)
	putT, delT := t.tableOpsNS(have, want)
	o := t.plane.objs
	err := batchPut(o.PkNsloc, putL, make([]uint8, len(putL)))
	if err == nil {
		err = batchPut(o.PkNsbe, putBK, putBV)
	}
	if err == nil && len(putT) > 0 {
		// Tables after the slots they name, before the frontends that
		// use them.
		err = t.rows.put(o.PkNsmag, putT)
	}
	if err == nil {
		// Ranges before the frontends that check them, so that no
		// source is refused while they are written.
		err = putEach(o.PkNsrange, putRK)
	}
	if err == nil {
		err = batchPut(o.PkNsfe, putFK, putFV)
	}
	if err == nil {
		err = batchDel(o.PkNsfe, delF)
	}
	if err == nil {
		err = batchDel(o.PkNsmag, delT)
	}
	if err == nil {
		err = batchDel(o.PkNsbe, delB)
	}
	if err == nil {
		err = delEach(o.PkNsrange, delR)
	}
	if err == nil {
		err = batchDel(o.PkNsloc, delL)
	}
	if err != nil {
		return fmt.Errorf("ebpf: tc: %w", err)
	}
	if n := len(putFK) + len(putBK) + len(delF) + len(delB); n > 0 {
		t.log.Debug("tc maps written", "frontends", len(want.fes), "slots", want.nslots, "written", len(putFK)+len(putBK), "deleted", len(delF)+len(delB))
	}
	return nil
}

// diffMaps returns the entries of want that have lacks or holds
// differently, and the keys of have that want lacks.
func diffMaps[K comparable, V comparable](have, want map[K]V) (putK []K, putV []V, del []K) {
	if n := len(want) - len(have); n > 0 {
		putK, putV = make([]K, 0, n), make([]V, 0, n)
	}
	for k, v := range want {
		if h, ok := have[k]; !ok || h != v {
			putK, putV = append(putK, k), append(putV, v)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			del = append(del, k)
		}
	}
	return putK, putV, del
}

// putEach and delEach write and delete entries one by one, for maps
// without batch operations (LPM tries).
func putEach[K any](m *ebpf.Map, keys []K) error {
	for _, k := range keys {
		if err := m.Put(k, uint8(0)); err != nil {
			return fmt.Errorf("update %s: %w", mapName(m), err)
		}
	}
	return nil
}

func delEach[K any](m *ebpf.Map, keys []K) error {
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", mapName(m), err)
		}
	}
	return nil
}

// Cleanup detaches the tc programs and removes the family's frontends
// and slots.
func (t *tcBackend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.plane == nil {
		return errClosed
	}
	err := t.plane.cleanup()
	have, rerr := t.readKernel()
	if rerr == nil {
		_, delL := presence(have.locals, nil)
		rerr = t.write(have, newNSState(), nil, delL)
	}
	t.st = nil
	clear(t.groups)
	return errors.Join(err, rerr)
}

// Close drops the backend's reference to the tc plane; the last one
// detaches the programs.
func (t *tcBackend) Close() error {
	if t.plane == nil {
		return nil
	}
	err := t.plane.release()
	t.plane = nil
	return err
}

// dsr reports whether the external frontends of service port sp send
// flows to remote endpoints by direct server return: its ForwardingMode
// when it names one, else Config.NorthSouthForwarding (hybrid: TCP
// only). An unknown ForwardingMode is logged once.
func (t *tcBackend) dsr(name model.ServicePortName, sp *model.ServicePort) bool {
	switch sp.ForwardingMode {
	case string(ForwardingDSR):
		delete(t.badMode, name)
		return true
	case string(ForwardingSNAT):
		delete(t.badMode, name)
		return false
	case "":
		delete(t.badMode, name)
	default:
		if !t.badMode[name] {
			t.badMode[name] = true
			t.log.Warn("unknown forwarding mode, the configured one is used", "service", name.String(),
				"mode", sp.ForwardingMode, "want", []Forwarding{ForwardingSNAT, ForwardingDSR}, "configured", t.plane.cfg.NorthSouthForwarding)
		}
	}
	switch t.plane.cfg.NorthSouthForwarding {
	case ForwardingDSR:
		return true
	case ForwardingHybrid:
		return sp.Protocol == model.TCP
	}
	return false
}

// maglev reports whether service port sp picks endpoints with Maglev:
// its Scheduler's choice, else the proxier's (Config.Scheduler). The
// socket backend logs an unknown Scheduler.
func (t *tcBackend) maglev(sp *model.ServicePort) bool {
	sel, _ := schedulerSelection(sp.Scheduler, t.plane.cfg.Scheduler)
	return sel == proxier.SchedulerMaglev
}

// targetsOrNone returns tg, or no targets for nil.
func targetsOrNone(tg *proxier.Targets) *proxier.Targets {
	if tg == nil {
		return &proxier.Targets{}
	}
	return tg
}
