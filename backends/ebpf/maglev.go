package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/proxier"
)

// Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and
// Reliable Software Network Load Balancer", NSDI 2016, section 3.4).
//
// Each endpoint group of a service port with Maglev selection (its
// Scheduler's, else Config.Scheduler) has a lookup table of M
// entries (M prime, Config.MaglevTableSize), each entry a slot of the
// group. Every endpoint has a preference list over the entries, the
// permutation offset, offset+skip, offset+2·skip, ... (mod M), where
// offset and skip come from two hashes of the endpoint's address and
// port; the endpoints take turns claiming their next preferred free
// entry until the table is full. Every endpoint so holds ⌊M/N⌋ or
// ⌈M/N⌉ entries, and when one endpoint leaves or joins, the entries of
// the others mostly stay theirs: about 1/N of the table moves.
//
// The socket programs index the table with a hash of the client
// socket's identity (see client_hash in bpf/sock.c), so a client keeps
// its endpoint as long as that endpoint is there, and the clients of a
// removed endpoint spread over the others while every other client
// stays where it was.

// maglevEmpty marks an unclaimed entry while a table is built.
const maglevEmpty = ^uint32(0)

// maxMaglevTableSize bounds Config.MaglevTableSize: a table of 131071
// entries takes 512 KiB.
const maxMaglevTableSize = 131071

// maglevHashes returns the two hashes of an endpoint's identity (its
// address, IPv4-mapped for IPv4, and port) that give its offset and
// skip: FNV-1a over the 18 bytes, finished with two differently seeded
// splitmix64 finalizers. They are fixed functions, so every process on
// every node builds the same table from the same endpoints.
func maglevHashes(ep netip.AddrPort) (h1, h2 uint64) {
	var b [18]byte
	a := mapped16(ep.Addr())
	copy(b[:16], a[:])
	binary.BigEndian.PutUint16(b[16:], ep.Port())
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix64(h ^ 0x9e3779b97f4a7c15), mix64(h ^ 0xd1b54a32d192ed03)
}

// mix64 is splitmix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// maglevTable returns the Maglev lookup table of m entries (m prime)
// for eps: each entry is an index into eps. The table depends on the
// set of endpoints, not on their order in eps: the endpoints take turns
// in the order of their address and port. With more endpoints than
// entries, those beyond the first m get none. eps must not hold
// duplicates. into, when it has room for m entries, is reused.
func maglevTable(eps []netip.AddrPort, m int, into []uint32) []uint32 {
	if len(eps) == 0 || m <= 0 {
		return nil
	}
	table := into[:0]
	if cap(table) < m {
		table = make([]uint32, m)
	}
	table = table[:m]
	for i := range table {
		table[i] = maglevEmpty
	}
	type pref struct {
		idx  uint32 // index into eps
		next uint32 // the next entry the endpoint prefers
		skip uint32
		addr netip.AddrPort
	}
	var small [16]pref
	prefs := small[:0]
	if len(eps) > len(small) {
		prefs = make([]pref, 0, len(eps))
	}
	prefs = prefs[:len(eps)]
	for i, ep := range eps {
		h1, h2 := maglevHashes(ep)
		skip := uint32(1)
		if m > 1 {
			skip = uint32(h2%uint64(m-1)) + 1
		}
		prefs[i] = pref{idx: uint32(i), next: uint32(h1 % uint64(m)), skip: skip, addr: ep}
	}
	slices.SortFunc(prefs, func(a, b pref) int { return a.addr.Compare(b.addr) })
	um := uint32(m)
	filled := 0
	for {
		for k := range prefs {
			p := &prefs[k]
			c := p.next
			// The preference list is a permutation of the entries (m is
			// prime and 0 < skip < m), so a free entry is found while
			// the table is not full.
			for table[c] != maglevEmpty {
				c += p.skip
				if c >= um {
					c -= um
				}
			}
			table[c] = p.idx
			c += p.skip
			if c >= um {
				c -= um
			}
			p.next = c
			filled++
			if filled == m {
				return table
			}
		}
	}
}

// isPrime reports whether n is a prime.
func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// checkMaglevTableSize checks Config.MaglevTableSize.
func checkMaglevTableSize(m int) error {
	if !isPrime(m) || m > maxMaglevTableSize {
		return fmt.Errorf("ebpf: Config.MaglevTableSize %d is not a prime between 2 and %d", m, maxMaglevTableSize)
	}
	return nil
}

// tableSum returns the fingerprint of a table row, to compare a row in
// the kernel with one that is not kept in memory.
func tableSum(seed maphash.Seed, row []uint32) uint64 {
	return maphash.Bytes(seed, rowBytes(row))
}

func rowBytes(row []uint32) []byte {
	if len(row) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&row[0])), 4*len(row))
}

// rowWriter writes Maglev tables to a map: it builds them in batches
// into one buffer, kept between syncs, and hands the buffer to the
// kernel as it is (no copy, no allocation per sync).
type rowWriter struct {
	m    int // entries per table
	seed maphash.Seed
	buf  []uint32
	// rows is buf seen as an array of [m]uint32 rows (types made at
	// run time); its slices are what the batch operations take without
	// copying.
	rows reflect.Value
}

func newRowWriter(m int, seed maphash.Seed) *rowWriter {
	return &rowWriter{m: m, seed: seed}
}

// batch returns the buffer for n rows, allocated at the first call.
func (w *rowWriter) batch(n int) []uint32 {
	if len(w.buf) < n*w.m {
		w.buf = make([]uint32, n*w.m)
		row := reflect.ArrayOf(w.m, reflect.TypeFor[uint32]())
		w.rows = reflect.NewAt(reflect.ArrayOf(n, row), unsafe.Pointer(&w.buf[0])).Elem()
	}
	return w.buf[:n*w.m]
}

// view returns the first k rows of the buffer as the batch operations
// take them.
func (w *rowWriter) view(k int) any { return w.rows.Slice(0, k).Interface() }

// build builds the tables of gs into the buffer (one worker per CPU when
// there are many) and records their fingerprints.
func (w *rowWriter) build(gs []*group, buf []uint32) {
	m := w.m
	one := func(i int) {
		g := gs[i]
		t := maglevTable(g.eps, m, buf[i*m:(i+1)*m:(i+1)*m])
		g.sum, g.hasSum = tableSum(w.seed, t), true
	}
	workers := min(runtime.GOMAXPROCS(0), len(gs)/32)
	if workers <= 1 {
		for i := range gs {
			one(i)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (len(gs) + workers - 1) / workers
	for start := 0; start < len(gs); start += chunk {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := start; i < min(start+chunk, len(gs)); i++ {
				one(i)
			}
		}()
	}
	wg.Wait()
}

// put builds the tables of gs and writes them to the map mp.
func (w *rowWriter) put(mp *ebpf.Map, gs []*group) error {
	per := rowsPerBatch(w.m)
	ids := make([]uint32, 0, per)
	for len(gs) > 0 {
		k := min(len(gs), per)
		buf := w.batch(per)
		w.build(gs[:k], buf)
		ids = ids[:0]
		for _, g := range gs[:k] {
			ids = append(ids, g.id)
		}
		if err := batchUpdate(mp, ids, w.view(k)); err != nil {
			return err
		}
		gs = gs[k:]
	}
	return nil
}

// scan calls fn with every row of the map mp; the row is valid during
// the call only.
func (w *rowWriter) scan(mp *ebpf.Map, fn func(id uint32, row []uint32)) error {
	if rowLen(mp) != w.m {
		return fmt.Errorf("%s has rows of %d entries, not %d", mapName(mp), rowLen(mp), w.m)
	}
	per := rowsPerBatch(w.m)
	keys := make([]uint32, per)
	var cursor ebpf.MapBatchCursor
	for {
		buf := w.batch(per)
		got, err := mp.BatchLookup(&cursor, keys, w.view(per), nil)
		for i := range got {
			fn(keys[i], buf[i*w.m:(i+1)*w.m])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", mapName(mp), err)
		}
	}
}

// rowLen is the number of entries of the rows of the Maglev map m.
func rowLen(m *ebpf.Map) int { return int(m.ValueSize() / 4) }

// rowsPerBatch is how many rows of n entries one batch operation
// carries: about 1 MiB (256 rows of 1021 entries), and at least 16 rows
// (a batch lookup of a hash map fails when a bucket holds more entries
// than the batch).
func rowsPerBatch(n int) int {
	return min(256, max(16, (1<<20)/(4*max(n, 1))))
}

// tableOps adds to o the Maglev rows that turn old (nil: none) into s
// (nil: deleted), for an incremental sync: the rows of groups whose
// table changed are written, those of groups that no longer use one are
// deleted.
func tableOps(o *ops, old, s *svcState) {
	oldSum := map[uint32]uint64{}
	if old != nil {
		for _, g := range old.groups {
			if g != nil && g.maglev && g.hasSum {
				oldSum[g.id] = g.sum
			}
		}
	}
	keep := map[uint32]bool{}
	if s != nil {
		for _, g := range s.groups {
			if g == nil || !g.maglev {
				continue
			}
			keep[g.id] = true
			if sum, ok := oldSum[g.id]; ok && g.hasSum && sum == g.sum {
				continue
			}
			o.putRows = append(o.putRows, g)
		}
	}
	if old != nil {
		for _, g := range old.groups {
			if g != nil && g.maglev && !keep[g.id] {
				o.delRows = append(o.delRows, g.id)
			}
		}
	}
}

// planTables decides which groups of s pick with a Maglev table, and
// gives those whose endpoints are what they were in prev (the service
// port's previous state, nil: none) the fingerprint of their unchanged
// table, so that it is neither rebuilt nor rewritten. The others are
// built when they are written. A group uses a table when sel (the
// service port's selection, see selectionFor) is Maglev and it has
// endpoints, no more than the table has entries. Tables are keyed by
// group id, and every service port has groups of its own: two service
// ports with the same endpoints but different selections have one
// table, or none, each.
func (b *backend) planTables(s, prev *svcState, sel proxier.Scheduler) {
	for role, g := range s.groups {
		if g == nil {
			continue
		}
		g.maglev = sel == proxier.SchedulerMaglev && len(g.eps) > 0 && len(g.eps) <= b.cfg.MaglevTableSize
		if !g.maglev || prev == nil {
			continue
		}
		if p := prev.groups[role]; p != nil && p.id == g.id && p.maglev && p.hasSum && slices.Equal(p.eps, g.eps) {
			g.sum, g.hasSum = p.sum, true
		}
	}
}
