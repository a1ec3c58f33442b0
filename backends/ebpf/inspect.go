package ebpf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file reads back what the backend programmed, for
// [proxier.Inspector]: the socket programs' maps of a family, decoded into
// frontends, merged with those of the composed nftables table.
//
// The two parts serve different sources. The socket programs translate
// the TCP and UDP sockets of the translated network namespaces under the
// cgroup (the node and its pods); every other source (packets from
// outside the node, processes outside the cgroup or the namespaces,
// SCTP, and frontends the maps do not hold) reaches the nftables table.
// So an endpoint reaches every source only when both parts send all
// their sources to it; a frontend only the nftables table holds serves
// every source through it; and a frontend only the maps hold serves the
// node and its pods alone, unless there is no nftables part at all
// (SocketOnly), where its sources are all the backend serves.

var _ proxier.Inspector = (*backend)(nil)

// Inspect implements [proxier.Inspector]: it reads the family's frontend,
// endpoint slot, Maglev table and node address maps, and the composed
// nftables table, back from the kernel, and returns their frontends,
// merged per address, protocol and port. The maps count only while a
// connect program of the family that uses them is attached to the
// cgroup (the backend's from the end of its first sync on, or a pinned
// predecessor's sharing them): else the nftables table serves every
// source.
func (b *backend) Inspect(ctx context.Context) ([]proxier.Frontend, error) {
	if b.dp == nil {
		return nil, errClosed
	}
	var packet []proxier.Frontend
	if b.nft != nil {
		in, ok := b.nft.(proxier.Inspector)
		if !ok {
			return nil, errors.New("ebpf: north-south rules: the nftables backend cannot read back its table")
		}
		var err error
		if packet, err = in.Inspect(ctx); err != nil {
			return nil, fmt.Errorf("ebpf: north-south rules: %w", err)
		}
	}
	on, err := b.dp.mapInUse(b.family, b.svcMap)
	if err != nil {
		return nil, err
	}
	var socket []proxier.Frontend
	if on {
		m := &socketMaps{svc: b.svcMap, be: b.beMap, mag: b.magMap, node: b.nodeMap}
		if socket, err = readSocketFrontends(ctx, b.family, m); err != nil {
			return nil, err
		}
	}
	return mergeParts(socket, packet, b.nft != nil), nil
}

// mapInUse reports whether a program attached to the cgroup for family
// f's connect hook uses m, as the kernel says: the backend's own
// program, or, after a restart and before the first sync swapped it,
// the predecessor's that shares the pinned maps.
func (d *dataplane) mapInUse(f model.IPFamily, m *ebpf.Map) (bool, error) {
	info, err := m.Info()
	if err != nil {
		return false, fmt.Errorf("ebpf: %s: %w", mapName(m), err)
	}
	id, ok := info.ID()
	if !ok {
		return false, fmt.Errorf("ebpf: %s: the kernel does not tell its id", mapName(m))
	}
	progs, err := cgroupPrograms(d.cfg.CgroupPath, connectHook(f).attach)
	if err != nil {
		return false, err
	}
	for _, p := range progs {
		ids, err := programMapIDs(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // detached meanwhile
		}
		if err != nil {
			return false, err
		}
		if slices.Contains(ids, id) {
			return true, nil
		}
	}
	return false, nil
}

// programMapIDs returns the ids of the maps program id uses.
func programMapIDs(id ebpf.ProgramID) ([]ebpf.MapID, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, fmt.Errorf("ebpf: program %d: %w", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return nil, fmt.Errorf("ebpf: program %d: %w", id, err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return nil, fmt.Errorf("ebpf: program %d: the kernel does not tell its maps", id)
	}
	return ids, nil
}

// Inspect reads what a proxier configured by cfg programmed in family,
// from the kernel and without a proxier, as the proxier's own Inspect
// does ([proxier.Inspector]): the frontends of the socket programs'
// maps merged with those of the nftables table cfg.TableName in
// cfg.NetNS (none with cfg.SocketOnly; a table that does not exist holds
// none).
//
// The maps are those of the connect program that is really attached:
// with cfg.PinPath, the program of the pinned link there (none attached
// when no link is pinned, or it was detached); without, the one attached
// to cfg.CgroupPath whose namespace map holds cfg.NetNS (several such
// programs, of proxiers with maps of their own, are an error: set
// PinPath to tell them apart). Without PinPath and CgroupPath the maps
// cannot be found, and Inspect fails. It needs CAP_SYS_ADMIN (to open
// programs and maps by id). The maps and the table are read in several
// requests, not atomically: a proxier syncing meanwhile may show half a
// change.
func Inspect(ctx context.Context, cfg Config, family model.IPFamily) ([]proxier.Frontend, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("ebpf: unknown IP family %v", family)
	}
	cfg = cfg.WithDefaults()
	var packet []proxier.Frontend
	if !cfg.SocketOnly {
		var err error
		packet, err = nftables.Inspect(ctx, nftables.Config{Config: cfg.Config, TableName: cfg.TableName}, family)
		if err != nil {
			return nil, fmt.Errorf("ebpf: north-south rules: %w", err)
		}
	}
	m, err := attachedMaps(cfg, family)
	if err != nil {
		return nil, err
	}
	var socket []proxier.Frontend
	if m != nil {
		defer m.Close()
		if socket, err = readSocketFrontends(ctx, family, m); err != nil {
			return nil, err
		}
	}
	return mergeParts(socket, packet, !cfg.SocketOnly), nil
}

// connectHook returns the connect hook of family f.
func connectHook(f model.IPFamily) hook {
	name := "connect4"
	if f == model.IPv6 {
		name = "connect6"
	}
	for _, h := range hooks() {
		if h.name == name {
			return h
		}
	}
	panic("ebpf: no hook " + name)
}

// queryTries bounds how often cgroupPrograms asks again when the
// cgroup's programs change while it asks.
const queryTries = 10

// cgroupPrograms returns the ids of the programs attached to the cgroup
// at path for attach (not those inherited from its ancestors).
func cgroupPrograms(path string, attach ebpf.AttachType) ([]ebpf.ProgramID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ebpf: cgroup: %w", err)
	}
	defer f.Close()
	// The kernel answers in two calls (the count, then the ids): a
	// program attached in between (by anybody) makes the second fail
	// with ENOSPC, so ask again.
	var res *link.QueryResult
	for try := 1; ; try++ {
		res, err = link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: attach})
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOSPC) || try == queryTries {
			return nil, fmt.Errorf("ebpf: programs attached to %s: %w", path, err)
		}
	}
	ids := make([]ebpf.ProgramID, len(res.Programs))
	for i, p := range res.Programs {
		ids[i] = p.ID
	}
	return ids, nil
}

// socketMaps are the maps of one family the socket programs read.
type socketMaps struct {
	svc, be, mag, node *ebpf.Map
	// netns is the namespace allowlist; set only by programMaps.
	netns *ebpf.Map
	// owned says the maps were opened here, and Close closes them.
	owned bool
}

// Close closes maps opened by programMaps.
func (m *socketMaps) Close() error {
	if !m.owned {
		return nil
	}
	var errs []error
	for _, x := range []*ebpf.Map{m.svc, m.be, m.mag, m.node, m.netns} {
		if x != nil {
			errs = append(errs, x.Close())
		}
	}
	return errors.Join(errs...)
}

// attachedMaps finds the maps of family's connect program that cfg's
// proxier attached; nil when none is attached.
func attachedMaps(cfg Config, family model.IPFamily) (*socketMaps, error) {
	h := connectHook(family)
	if cfg.PinPath != "" {
		return pinnedLinkMaps(filepath.Join(cfg.PinPath, linkPin(h)), family)
	}
	if cfg.CgroupPath == "" {
		return nil, errors.New("ebpf: Inspect finds the socket programs' maps through Config.PinPath or Config.CgroupPath; neither is set")
	}
	return cgroupMaps(cfg, family, h)
}

// pinnedLinkMaps returns the maps of the program of the link pinned at
// pin, or nil when no link is pinned there or it is detached.
func pinnedLinkMaps(pin string, family model.IPFamily) (*socketMaps, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ebpf: pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("ebpf: pinned link %s: %w", pin, err)
	}
	if cg := info.Cgroup(); cg == nil || cg.CgroupId == 0 {
		return nil, nil // detached
	}
	return programMaps(info.Program, family)
}

// cgroupMaps returns the maps of the connect program attached to
// cfg.CgroupPath that translates cfg.NetNS, or nil when there is none.
func cgroupMaps(cfg Config, family model.IPFamily, h hook) (*socketMaps, error) {
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	cookie, err := netnsCookie(ns)
	ns.Close()
	if err != nil {
		return nil, fmt.Errorf("ebpf: cookie of network namespace %q: %w", cfg.NetNS, err)
	}
	ids, err := cgroupPrograms(cfg.CgroupPath, h.attach)
	if err != nil {
		return nil, err
	}
	var found []*socketMaps
	closeAll := func() {
		for _, m := range found {
			m.Close()
		}
	}
	for _, id := range ids {
		m, err := programMaps(id, family)
		if errors.Is(err, errNotOurs) || errors.Is(err, fs.ErrNotExist) {
			continue // not ours, or detached meanwhile
		}
		if err != nil {
			closeAll()
			return nil, err
		}
		var v uint8
		err = m.netns.Lookup(cookie, &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			m.Close() // another proxier's, of other namespaces
			continue
		}
		found = append(found, m)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("ebpf: %s of program %d: %w", mapNetNS, id, err)
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	closeAll()
	return nil, fmt.Errorf("ebpf: %d proxykit programs on %s translate network namespace %q; set Config.PinPath to choose one", len(found), cfg.CgroupPath, cfg.NetNS)
}

// errNotOurs marks a program that is not the backend's connect program.
var errNotOurs = errors.New("not a proxykit connect program")

// programMaps opens the maps of family the program id uses, which must
// be the backend's connect program of family (else errNotOurs).
func programMaps(id ebpf.ProgramID, family model.IPFamily) (*socketMaps, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, fmt.Errorf("ebpf: program %d: %w", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return nil, fmt.Errorf("ebpf: program %d: %w", id, err)
	}
	if info.Name != "pk_"+connectHook(family).name {
		return nil, errNotOurs
	}
	mapIDs, ok := info.MapIDs()
	if !ok {
		return nil, fmt.Errorf("ebpf: program %d: the kernel does not tell its maps", id)
	}
	svc, be, node, mag := mapSvc4, mapBe4, mapNode4, mapMag4
	if family == model.IPv6 {
		svc, be, node, mag = mapSvc6, mapBe6, mapNode6, mapMag6
	}
	m := &socketMaps{owned: true}
	want := map[string]**ebpf.Map{svc: &m.svc, be: &m.be, node: &m.node, mag: &m.mag, mapNetNS: &m.netns}
	for _, mid := range mapIDs {
		x, err := ebpf.NewMapFromID(mid)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("ebpf: map %d of program %d: %w", mid, id, err)
		}
		mi, err := x.Info()
		if err != nil {
			x.Close()
			m.Close()
			return nil, fmt.Errorf("ebpf: map %d of program %d: %w", mid, id, err)
		}
		if dst := want[mi.Name]; dst != nil && *dst == nil {
			*dst = x
			continue
		}
		x.Close()
	}
	for name, dst := range want {
		if *dst == nil {
			m.Close()
			return nil, fmt.Errorf("ebpf: program %d (%s) uses no map %s", id, info.Name, name)
		}
	}
	return m, nil
}

// socketTables is what the maps of one family hold, indexed for decoding.
type socketTables struct {
	family model.IPFamily
	svc    map[feKey]svcVal
	// slots are the endpoints of each group, indexed by slot; a slot
	// missing from the map is the zero AddrPort.
	slots map[uint32][]netip.AddrPort
	// rows are, per group with a Maglev table, the slots its entries
	// lead to (resolveRow), sorted.
	rows map[uint32][]uint32
	// rowLen is the entries of a Maglev table.
	rowLen int
	// nodes counts the node addresses node ports open on.
	nodes int
}

// readSocketFrontends reads the maps m of family (each once) and decodes
// their frontends.
func readSocketFrontends(ctx context.Context, family model.IPFamily, m *socketMaps) ([]proxier.Frontend, error) {
	t, err := readTables(ctx, family, m)
	if err != nil {
		return nil, err
	}
	return t.frontends(), nil
}

// readTables reads the frontends, then the slots, then the Maglev tables
// of the groups whose frontends pick with one, and counts the node
// addresses.
func readTables(ctx context.Context, family model.IPFamily, m *socketMaps) (*socketTables, error) {
	c := codecFor(family)
	t := &socketTables{family: family, slots: map[uint32][]netip.AddrPort{}, rows: map[uint32][]uint32{}, rowLen: rowLen(m.mag)}
	var err error
	if t.svc, err = c.readSvc(m.svc); err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	err = c.scanBe(m.be, func(k beKey, ep netip.AddrPort) {
		if !ep.IsValid() {
			return
		}
		s := t.slots[k.ID]
		if int(k.Slot) >= len(s) {
			s = slices.Grow(s, int(k.Slot)+1-len(s))[:k.Slot+1]
		}
		s[k.Slot] = ep
		t.slots[k.ID] = s
	})
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	maglev := map[uint32]bool{}
	for _, v := range t.svc {
		if v.Flags&svcMaglev != 0 && v.Count > 0 {
			maglev[v.ID] = true
		}
	}
	if len(maglev) > 0 {
		var stamp rowStamp
		err = newRowWriter(t.rowLen, maphash.MakeSeed()).scan(m.mag, func(id uint32, row []uint32) {
			if maglev[id] {
				t.rows[id] = stamp.resolve(row, t.slots[id])
			}
		})
		if err != nil {
			return nil, fmt.Errorf("ebpf: %w", err)
		}
	}
	nodes, err := c.readNode(m.node)
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	t.nodes = len(nodes)
	return t, nil
}

// rowStamp finds the distinct slots of Maglev rows without allocating
// per row: seen[s] == gen marks slot s seen in the current row.
type rowStamp struct {
	seen []uint32
	gen  uint32
}

// resolve returns the slots the entries of row lead a connect to, sorted:
// the slot an entry names when the group has it (at any index: the
// program does not check the frontend's count), else slot 0, the
// program's fallback, when the group has it (else the connect passes
// untranslated).
func (r *rowStamp) resolve(row []uint32, slots []netip.AddrPort) []uint32 {
	if len(r.seen) < len(slots) {
		r.seen = make([]uint32, len(slots))
		r.gen = 0
	}
	if r.gen++; r.gen == 0 {
		clear(r.seen)
		r.gen = 1
	}
	var out []uint32
	for _, s := range row {
		if int64(s) >= int64(len(slots)) || !slots[s].IsValid() {
			s = 0
			if len(slots) == 0 || !slots[0].IsValid() {
				continue
			}
		}
		if r.seen[s] != r.gen {
			r.seen[s] = r.gen
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// frontends decodes every frontend of t, in no particular order. Node
// ports are left out when no node address is in the node address map:
// they match no destination then. Frontends of a protocol the programs
// do not translate are never matched, and left out too.
func (t *socketTables) frontends() []proxier.Frontend {
	out := make([]proxier.Frontend, 0, len(t.svc))
	type pick struct {
		id, count uint32
		maglev    bool
	}
	cache := map[pick]picked{}
	for k, v := range t.svc {
		proto, ok := model.ProtocolOfNumber(k.proto)
		if !ok || protoNumber(proto) == 0 {
			continue
		}
		if k.addr.IsUnspecified() && t.nodes == 0 {
			continue
		}
		f := proxier.Frontend{Protocol: proto, Port: k.port, Affinity: v.AffinitySec > 0}
		if !k.addr.IsUnspecified() {
			f.Addr = k.addr
		}
		var p picked
		if v.Count == 0 {
			f.Verdict = "reject"
			if v.Flags&svcDrop != 0 {
				f.Verdict = "drop"
			}
		} else {
			key := pick{v.ID, v.Count, v.Flags&svcMaglev != 0}
			var hit bool
			if p, hit = cache[key]; !hit {
				p = t.pick(key.id, key.count, key.maglev)
				cache[key] = p
			}
			f.Endpoints = p.eps
		}
		f.Detail = t.detail(k, v, p)
		if v.Flags&svcNodeOnly != 0 {
			// Non-nil: the maps apply source ranges (for the
			// node's sockets, decided at the last sync).
			f.SourceRanges = []netip.Prefix{}
		}
		out = append(out, f)
	}
	return out
}

// picked is where the picks of a group go.
type picked struct {
	eps []netip.AddrPort
	// how is "maglev table" or "random".
	how string
	// missing counts slots below the count that the map lacks; untrans
	// says their picks pass untranslated (slot 0 is missing too).
	missing int
	untrans bool
}

// pick returns the endpoints new connections to a frontend of group id
// with count slots reach: those of its Maglev table's entries when it
// picks with one and has one, else those of slots 0..count-1, a missing
// slot falling back to slot 0 as the program does.
func (t *socketTables) pick(id, count uint32, maglev bool) picked {
	slots := t.slots[id]
	if row, ok := t.rows[id]; ok && maglev {
		p := picked{how: fmt.Sprintf("maglev table of %d entries", t.rowLen)}
		for _, s := range row {
			p.eps = append(p.eps, slots[s])
		}
		p.untrans = len(p.eps) == 0
		return distinct(p)
	}
	p := picked{how: "random"}
	if maglev {
		p.how = "random (maglev flag without a table)"
	}
	for s := range count {
		if int(s) < len(slots) && slots[s].IsValid() {
			p.eps = append(p.eps, slots[s])
			continue
		}
		p.missing++
	}
	if p.missing > 0 && (len(slots) == 0 || !slots[0].IsValid()) {
		p.untrans = true
	}
	return distinct(p)
}

// distinct sorts p's endpoints and drops repeats (an endpoint in two
// slots).
func distinct(p picked) picked {
	slices.SortFunc(p.eps, netip.AddrPort.Compare)
	p.eps = slices.Compact(p.eps)
	return p
}

// detail describes where the maps hold frontend k.
func (t *socketTables) detail(k feKey, v svcVal, p picked) string {
	svc := mapSvc4
	if t.family == model.IPv6 {
		svc = mapSvc6
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s group %d, %d slots", svc, v.ID, v.Count)
	switch {
	case v.Count == 0 && v.Flags&svcDrop != 0:
		b.WriteString(", no local endpoint (EPERM)")
	case v.Count == 0:
		b.WriteString(", no endpoint (ECONNREFUSED)")
	default:
		b.WriteString(", " + p.how)
	}
	if v.Flags&svcNodeOnly != 0 {
		if v.Count == 0 && v.Flags&svcDrop != 0 {
			b.WriteString(" (the node's source is outside the source ranges)")
		}
		b.WriteString(", the node's sockets only")
	}
	if p.missing > 0 {
		fmt.Fprintf(&b, ", %d slots missing", p.missing)
	}
	if p.untrans {
		b.WriteString(", some picks find no slot and pass untranslated")
	}
	if v.AffinitySec > 0 {
		fmt.Fprintf(&b, ", affinity %ds", v.AffinitySec)
	}
	if k.addr.IsUnspecified() {
		fmt.Fprintf(&b, ", on %d node addresses", t.nodes)
	}
	return b.String()
}

// feID is a frontend's address, protocol and port.
type feID struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

func idOf(f *proxier.Frontend) feID { return feID{f.Addr, f.Protocol, f.Port} }

// mergeParts merges the frontends of the socket programs and of the
// nftables table (composed says there is one) per address, protocol and
// port. The socket programs serve the node's and its pods' sockets, the
// table every other source:
//
//   - a frontend of both: the endpoints both send all their sources to
//     reach every source, the others some; a verdict of either applies
//     to some sources and is kept (two different ones are both named);
//   - a frontend of the table alone: the sockets are not translated and
//     reach the table, which serves every source;
//   - a frontend of the maps alone: with a table, its endpoints reach
//     only the node and its pods (other sources find no rule); without
//     one (SocketOnly), the node and its pods are every source served.
func mergeParts(socket, packet []proxier.Frontend, composed bool) []proxier.Frontend {
	idx := make(map[feID]int, len(packet))
	for i := range packet {
		if _, dup := idx[idOf(&packet[i])]; !dup {
			idx[idOf(&packet[i])] = i
		}
	}
	out := make([]proxier.Frontend, 0, len(packet)+len(socket))
	used := make([]bool, len(packet))
	for i := range socket {
		s := &socket[i]
		j, ok := idx[idOf(s)]
		switch {
		case ok:
			used[j] = true
			out = append(out, mergeFrontend(s, &packet[j]))
		case composed:
			f := *s
			f.SomeSources = sortedAddrs(append(slices.Clone(s.Endpoints), s.SomeSources...))
			f.Endpoints = nil
			f.Detail = "sockets: " + s.Detail + "; packets: no rule (other sources are not translated)"
			out = append(out, f)
		default:
			f := *s
			f.Detail = "sockets: " + s.Detail
			out = append(out, f)
		}
	}
	for j := range packet {
		if !used[j] {
			f := packet[j]
			if composed && f.Detail != "" {
				f.Detail = "packets: " + f.Detail
			}
			out = append(out, f)
		}
	}
	return out
}

// mergeFrontend merges the socket programs' frontend s with the nftables
// table's p of the same address, protocol and port.
func mergeFrontend(s, p *proxier.Frontend) proxier.Frontend {
	if s.SourceRanges != nil && p.SourceRanges != nil && s.Verdict == "drop" {
		// A node-only frontend (north-south at tc) dropping the
		// node's sockets, whose source is outside the ranges: the
		// ranges at work, which p states for every source.
		f := *p
		f.Detail = "sockets: " + s.Detail + "; packets: " + p.Detail
		return f
	}
	f := proxier.Frontend{Addr: p.Addr, Protocol: p.Protocol, Port: p.Port}
	inP := newAddrSet(p.Endpoints)
	for _, a := range s.Endpoints {
		if inP.has(a) {
			f.Endpoints = append(f.Endpoints, a)
		}
	}
	f.Endpoints = sortedAddrs(f.Endpoints)
	every := newAddrSet(f.Endpoints)
	var some []netip.AddrPort
	for _, part := range [][]netip.AddrPort{s.Endpoints, s.SomeSources, p.Endpoints, p.SomeSources} {
		for _, a := range part {
			if !every.has(a) {
				some = append(some, a)
			}
		}
	}
	f.SomeSources = sortedAddrs(some)
	f.Verdict = mergeVerdicts(s.Verdict, p.Verdict)
	f.Affinity = mergeAffinity(s, p)
	f.Detail = "sockets: " + s.Detail + "; packets: " + p.Detail
	switch {
	case p.SourceRanges != nil && s.SourceRanges != nil:
		// A node-only frontend admitting the node's sockets (their
		// source is in the ranges); the pods' sockets pass to the
		// packet path, which checks the ranges.
		f.SourceRanges = p.SourceRanges
	case p.SourceRanges != nil:
		// The socket programs admit the node's and the pods' sockets
		// whatever the ranges: not only the sources the ranges name
		// (the programs hold a load-balancer IP with ranges only as
		// a node-only frontend, so this is a fault to show).
		f.Detail += fmt.Sprintf("; the source ranges %v apply to packets only", p.SourceRanges)
	}
	return f
}

// mergeVerdicts returns the verdict of some sources: the one verdict of
// the parts, or both when they differ.
func mergeVerdicts(socket, packet string) string {
	if socket == "" || packet == "" || socket == packet {
		return cmp.Or(packet, socket)
	}
	return packet + " (node and pod sockets: " + socket + ")"
}

// mergeAffinity says clients stick to an endpoint: when every part that
// has endpoints makes them stick (a part without endpoints has nothing
// to stick to), or, when neither has, when either records affinity.
func mergeAffinity(s, p *proxier.Frontend) bool {
	has := func(f *proxier.Frontend) bool { return len(f.Endpoints)+len(f.SomeSources) > 0 }
	switch {
	case has(s) && has(p):
		return s.Affinity && p.Affinity
	case has(s):
		return s.Affinity
	case has(p):
		return p.Affinity
	}
	return s.Affinity || p.Affinity
}

// sortedAddrs sorts eps and drops repeats; nil when empty.
func sortedAddrs(eps []netip.AddrPort) []netip.AddrPort {
	if len(eps) == 0 {
		return nil
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps)
}
