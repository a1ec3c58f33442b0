package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// endpointSet returns n distinct endpoints; set picks one of many
// different address ranges.
func endpointSet(set, n int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		k := set*1000 + i
		out[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(64 + k>>16), byte(k >> 8), byte(k)}), uint16(8080+set%3))
	}
	return out
}

// owners returns the endpoint of every entry of a table of indices into eps.
func owners(eps []netip.AddrPort, table []uint32) []netip.AddrPort {
	out := make([]netip.AddrPort, len(table))
	for i, e := range table {
		out[i] = eps[e]
	}
	return out
}

// TestMaglevTableSpread: every endpoint holds ⌊M/N⌋ or ⌈M/N⌉ entries,
// so shares differ by at most one entry (1% at 10 endpoints in 1021).
func TestMaglevTableSpread(t *testing.T) {
	for _, m := range []int{1021, 251, 16381} {
		for _, n := range []int{1, 2, 3, 7, 10, 33, 100} {
			eps := endpointSet(n, n)
			table := maglevTable(eps, m, nil)
			if len(table) != m {
				t.Fatalf("M=%d N=%d: table of %d entries", m, n, len(table))
			}
			count := make([]int, n)
			for _, e := range table {
				if int(e) >= n {
					t.Fatalf("M=%d N=%d: entry %d is no endpoint", m, n, e)
				}
				count[e]++
			}
			lo, hi := slices.Min(count), slices.Max(count)
			if lo < m/n || hi > (m+n-1)/n {
				t.Errorf("M=%d N=%d: endpoints hold %d to %d entries, want %d to %d", m, n, lo, hi, m/n, (m+n-1)/n)
			}
			if m >= 1021 && n <= 10 && float64(hi-lo)/float64(lo) > 0.03 {
				t.Errorf("M=%d N=%d: shares differ by %.1f%%", m, n, 100*float64(hi-lo)/float64(lo))
			}
		}
	}
	// More endpoints than entries: each entry a different endpoint.
	table := maglevTable(endpointSet(1, 20), 7, nil)
	if s := slices.Compact(slices.Sorted(slices.Values(table))); len(s) != 7 {
		t.Errorf("20 endpoints in 7 entries: %v, want 7 different ones", table)
	}
}

// TestMaglevTableDisruption: when one endpoint of N leaves, its entries
// go to the others and only a few percent of the others' entries move
// (a modulo over the endpoints would move most); when one joins, it
// takes about 1/(N+1) of the table and only a few percent more move.
// The extra moves grow with N/M (the Maglev paper, figure 11): on
// average, 0.4% at 3 endpoints in 1021 entries, 2.5% at 10, 4% at 30.
func TestMaglevTableDisruption(t *testing.T) {
	const m = 1021
	for _, n := range []int{3, 10, 30} {
		var sumRemove, sumAdd float64
		const sets = 40
		for set := range sets {
			all := endpointSet(set, n+1)
			eps := all[:n]
			before := owners(eps, maglevTable(eps, m, nil))
			gone := eps[set%n]
			rest := slices.DeleteFunc(slices.Clone(eps), func(a netip.AddrPort) bool { return a == gone })
			after := owners(rest, maglevTable(rest, m, nil))
			moved := 0
			for i := range before {
				switch {
				case before[i] == gone && after[i] == gone:
					t.Fatalf("entry %d still on the removed endpoint", i)
				case before[i] != gone && after[i] != before[i]:
					moved++
				}
			}
			fr := float64(moved) / m
			sumRemove += fr
			if fr > 0.10 {
				t.Errorf("N=%d set %d: removing one endpoint moved %.1f%% of the others' entries", n, set, 100*fr)
			}
			grown := owners(all, maglevTable(all, m, nil))
			changed := 0
			for i := range before {
				if grown[i] != before[i] {
					changed++
				}
			}
			fa := float64(changed)/m - 1/float64(n+1)
			sumAdd += fa
			if fa > 0.10 {
				t.Errorf("N=%d set %d: adding one endpoint moved %.1f%% more than its share", n, set, 100*fa)
			}
		}
		t.Logf("N=%d M=%d: on average, a removal moves %.2f%% of the other entries; an addition %.2f%% beyond the newcomer's share",
			n, m, 100*sumRemove/sets, 100*sumAdd/sets)
		if avg := sumRemove / sets; avg > 0.05 {
			t.Errorf("N=%d: a removal moves %.1f%% of the other entries on average", n, 100*avg)
		}
		if avg := sumAdd / sets; avg > 0.05 {
			t.Errorf("N=%d: an addition moves %.1f%% beyond its share on average", n, 100*avg)
		}
	}
}

// TestMaglevTableDeterministic: the table is a function of the set of
// endpoints: the same for any order, and for every call.
func TestMaglevTableDeterministic(t *testing.T) {
	eps := endpointSet(7, 12)
	want := owners(eps, maglevTable(eps, 1021, nil))
	r := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		shuffled := slices.Clone(eps)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := owners(shuffled, maglevTable(shuffled, 1021, nil)); !slices.Equal(got, want) {
			t.Fatal("the table depends on the order of the endpoints")
		}
	}
	// IPv6 endpoints and ports count.
	v6 := []netip.AddrPort{netip.MustParseAddrPort("[fd00::1]:80"), netip.MustParseAddrPort("[fd00::1]:81"), netip.MustParseAddrPort("[fd00::2]:80")}
	count := map[uint32]int{}
	for _, e := range maglevTable(v6, 1021, nil) {
		count[e]++
	}
	if len(count) != 3 {
		t.Errorf("IPv6 endpoints differing in the port share %v", count)
	}
	if maglevTable(nil, 1021, nil) != nil {
		t.Error("a table without endpoints")
	}
}

func TestMaglevTableSize(t *testing.T) {
	for _, c := range []struct {
		m  int
		ok bool
	}{{1021, true}, {2, true}, {16381, true}, {131071, true}, {1, false}, {1000, false}, {1023, false}, {131101, false}} {
		if err := checkMaglevTableSize(c.m); (err == nil) != c.ok {
			t.Errorf("MaglevTableSize %d: %v", c.m, err)
		}
	}
}

// TestRowWriterView: the batch buffer is handed to the batch operations
// as rows of the table size, without copying.
func TestRowWriterView(t *testing.T) {
	w := newRowWriter(7, maphash.MakeSeed())
	buf := w.batch(rowsPerBatch(7))
	if len(buf) != 7*rowsPerBatch(7) {
		t.Fatalf("buffer of %d entries", len(buf))
	}
	buf[7] = 42
	v := reflect.ValueOf(w.view(3))
	if v.Len() != 3 || v.Type().Elem().Len() != 7 || v.Index(1).Index(0).Uint() != 42 {
		t.Errorf("view: %v", v)
	}
	if binary.Size(w.view(3)) != 3*7*4 {
		t.Errorf("view of 3 rows is %d bytes", binary.Size(w.view(3)))
	}
	if n := rowsPerBatch(1021); n != 256 {
		t.Errorf("%d rows of 1021 per batch", n)
	}
	if n := rowsPerBatch(131071); n != 16 {
		t.Errorf("%d rows of 131071 per batch", n)
	}
}

// TestPlanTables: groups use a table with Maglev selection only; an
// unchanged group keeps its fingerprint (not rebuilt); a service port
// beyond MaxMaglevTables picks at random; frontends carry the flag.
func TestPlanTables(t *testing.T) {
	b := &backend{cfg: Config{Scheduler: proxier.SchedulerMaglev, MaglevTableSize: 7, MaxMaglevTables: 2}.WithDefaults(), rows: newRowWriter(7, maphash.MakeSeed()),
		warned: newSchedulerWarnings(), log: slog.New(slog.DiscardHandler)}
	ids := &idAllocator{}
	e := backendtest.Endpoints
	sp := func(name string, ip string) *model.ServicePort {
		return &model.ServicePort{Name: backendtest.PortName(name, "", model.TCP), ClusterIP: netip.MustParseAddr(ip), Port: 80, Protocol: model.TCP}
	}
	st := newState()
	mk := func(p *model.ServicePort, eps []*model.Endpoint, prev *svcState) *svcState {
		s, err := render(model.IPv4, p, &proxier.Targets{Internal: eps, External: eps, HasEndpoints: len(eps) > 0}, prev, ids)
		if err != nil {
			t.Fatal(err)
		}
		b.planTables(s, prev, b.selectionFor(p))
		if prev != nil {
			st.release(p.Name)
		}
		if err := st.admit(p.Name, s, &b.cfg, model.IPv4); err != nil {
			t.Fatal(err)
		}
		var gs []*group
		for _, g := range s.groups {
			if g != nil && g.maglev && !g.hasSum {
				gs = append(gs, g)
			}
		}
		b.rows.build(gs, b.rows.batch(len(gs)+1)) // as a write does
		return s
	}
	a := mk(sp("a", "10.96.0.1"), e("10.244.1.1:80", "10.244.1.2:80"), nil)
	if g := a.groups[0]; !g.maglev || !g.hasSum || a.fes[0].val.Flags&svcMaglev == 0 {
		t.Fatalf("group %+v, frontend %+v: want a table and the flag", g, a.fes[0])
	}
	if want := tableSum(b.rows.seed, maglevTable(a.groups[0].eps, 7, nil)); a.groups[0].sum != want {
		t.Errorf("fingerprint %x, want %x", a.groups[0].sum, want)
	}
	a2 := mk(sp("a", "10.96.0.1"), e("10.244.1.2:80", "10.244.1.1:80"), a)
	if g := a2.groups[0]; !g.hasSum || g.sum != a.groups[0].sum {
		t.Errorf("unchanged endpoints: fingerprint lost")
	}
	none := mk(sp("none", "10.96.0.2"), nil, nil)
	if len(none.fes) != 1 || none.fes[0].val.Flags&svcMaglev != 0 || none.groups[0].maglev {
		t.Errorf("service without endpoints: %+v uses a table", none.fes)
	}
	mk(sp("b", "10.96.0.3"), e("10.244.1.3:80"), nil)
	c := mk(sp("c", "10.96.0.4"), e("10.244.1.4:80"), nil)
	if c.groups[0].maglev || c.fes[0].val.Flags&svcMaglev != 0 || st.noTable != 1 || st.ntables != 2 {
		t.Errorf("beyond MaxMaglevTables: maglev %v, flags %d, noTable %d, tables %d; want random selection", c.groups[0].maglev, c.fes[0].val.Flags, st.noTable, st.ntables)
	}
	big := mk(sp("big", "10.96.0.5"), e("10.244.2.1:80", "10.244.2.2:80", "10.244.2.3:80", "10.244.2.4:80", "10.244.2.5:80", "10.244.2.6:80", "10.244.2.7:80", "10.244.2.8:80"), nil)
	if big.groups[0].maglev {
		t.Error("a group with more endpoints than table entries uses a table")
	}

	// Incremental row ops: unchanged -> nothing; changed -> a write;
	// deleted -> a delete.
	o := &ops{}
	tableOps(o, a, a2)
	if len(o.putRows)+len(o.delRows) != 0 {
		t.Errorf("unchanged table: ops %+v", o)
	}
	a3 := mk(sp("a", "10.96.0.1"), e("10.244.1.2:80"), a2)
	tableOps(o, a2, a3)
	if len(o.putRows) != 1 || o.putRows[0] != a3.groups[0] {
		t.Errorf("changed table: ops %+v", o)
	}
	o = &ops{}
	tableOps(o, a3, nil)
	if !slices.Equal(o.delRows, []uint32{a3.groups[0].id}) {
		t.Errorf("deleted service: ops %+v", o)
	}

	// Random selection: no table, no flag.
	b.cfg.Scheduler = proxier.SchedulerRandom
	r := mk(sp("r", "10.96.0.9"), e("10.244.1.9:80"), nil)
	if r.groups[0].maglev || r.fes[0].val.Flags != 0 {
		t.Errorf("random selection: %+v", r.fes)
	}
}

// TestConfigScheduler: Config.Scheduler takes the backend's schedulers
// by any of their names, and rejects another one with the project's one
// "unsupported" error.
func TestConfigScheduler(t *testing.T) {
	for in, want := range map[proxier.Scheduler]proxier.Scheduler{
		"": proxier.SchedulerRandom, "random": proxier.SchedulerRandom,
		"mh": proxier.SchedulerMaglev, "Maglev": proxier.SchedulerMaglev,
	} {
		c := Config{CgroupPath: "/sys/fs/cgroup", Scheduler: in}.WithDefaults()
		if err := c.check(); err != nil || c.Scheduler != want {
			t.Errorf("Scheduler %q: %q, %v; want %q", in, c.Scheduler, err, want)
		}
	}
	for _, in := range []proxier.Scheduler{"rr", "roundrobin"} {
		c := Config{CgroupPath: "/sys/fs/cgroup", Scheduler: in}.WithDefaults()
		if err := c.check(); !errors.Is(err, proxier.ErrNotSupported) {
			t.Errorf("Scheduler %q: %v; want an error matching ErrNotSupported", in, err)
		}
	}
}

// TestSchedulerSelection: the Scheduler values a service port can ask
// for, and what an unknown one gets.
func TestSchedulerSelection(t *testing.T) {
	for _, def := range []proxier.Scheduler{proxier.SchedulerRandom, proxier.SchedulerMaglev} {
		for _, c := range []struct {
			scheduler string
			want      proxier.Scheduler
			known     bool
		}{
			{"", def, true},
			{"maglev", proxier.SchedulerMaglev, true},
			{"mh", proxier.SchedulerMaglev, true},
			{"random", proxier.SchedulerRandom, true},
			{" MH ", proxier.SchedulerMaglev, true},
			{"Random", proxier.SchedulerRandom, true},
			{"rr", def, false},
			{"wrr", def, false},
			{"sh", def, false},
			{"maglev-hash", def, false},
			{"ring_hash", def, false},
		} {
			got, known := schedulerSelection(c.scheduler, def)
			if got != c.want || known != c.known {
				t.Errorf("schedulerSelection(%q, %v) = %v, %v; want %v, %v", c.scheduler, def, got, known, c.want, c.known)
			}
		}
	}
}

// TestMaxMaglevTablesDefault: the Maglev maps are large with Maglev
// selection, small with random selection (where only service ports
// asking for Maglev use them); a value set is kept.
func TestMaxMaglevTablesDefault(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want int
	}{
		{Config{}, DefaultMaxMaglevTablesRandom},
		{Config{Scheduler: proxier.SchedulerMaglev}, DefaultMaxMaglevTables},
		{Config{MaxMaglevTables: 10}, 10},
		{Config{Scheduler: proxier.SchedulerMaglev, MaxMaglevTables: 10}, 10},
	} {
		if got := c.cfg.WithDefaults().MaxMaglevTables; got != c.want {
			t.Errorf("%v selection, MaxMaglevTables %d: default %d, want %d", c.cfg.Scheduler, c.cfg.MaxMaglevTables, got, c.want)
		}
	}
	if DefaultMaxMaglevTablesRandom >= DefaultMaxMaglevTables {
		t.Error("the random selection's default is not the smaller one")
	}
}

// logRecorder is a slog handler that keeps the warnings (with every
// attribute, those of With included) and passes every record on.
type logRecorder struct {
	mu       *sync.Mutex
	warnings *[]map[string]string
	attrs    []slog.Attr
	next     slog.Handler
}

func newLogRecorder(next slog.Handler) *logRecorder {
	return &logRecorder{mu: &sync.Mutex{}, warnings: &[]map[string]string{}, next: next}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		m := map[string]string{"msg": r.Message}
		for _, a := range h.attrs {
			m[a.Key] = a.Value.String()
		}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		h.mu.Lock()
		*h.warnings = append(*h.warnings, m)
		h.mu.Unlock()
	}
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clone(h.attrs), as...)
	if h.next != nil {
		c.next = h.next.WithAttrs(as)
	}
	return &c
}

func (h *logRecorder) WithGroup(name string) slog.Handler {
	c := *h
	if h.next != nil {
		c.next = h.next.WithGroup(name)
	}
	return &c
}

// schedulerWarnings returns the warnings about unknown schedulers.
func (h *logRecorder) schedulerWarnings() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, w := range *h.warnings {
		if w["scheduler"] != "" {
			out = append(out, w)
		}
	}
	return out
}

// tablesFullWarnings returns the warnings about full Maglev maps.
func (h *logRecorder) tablesFullWarnings() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, w := range *h.warnings {
		if strings.Contains(w["msg"], "Maglev tables full") {
			out = append(out, w)
		}
	}
	return out
}

// TestPlanTablesPerService: with random selection, a service port whose
// Scheduler asks for Maglev gets a table and the flag, one with the
// same endpoints and no Scheduler none; with Maglev selection, one
// asking for "random" none; an unknown value gets the proxier's
// selection. Beyond MaxMaglevTables, a service port asking for Maglev
// picks at random, and the warning says so.
func TestPlanTablesPerService(t *testing.T) {
	rec := newLogRecorder(nil)
	b := &backend{cfg: Config{MaglevTableSize: 7, MaxMaglevTables: 3}.WithDefaults(), family: model.IPv4,
		rows: newRowWriter(7, maphash.MakeSeed()), warned: newSchedulerWarnings(), log: slog.New(rec)}
	ids := &idAllocator{}
	e := backendtest.Endpoints
	both := e("10.244.1.1:80", "10.244.1.2:80")
	st := newState()
	mk := func(name, ip, scheduler string, eps []*model.Endpoint) *svcState {
		t.Helper()
		p := &model.ServicePort{Name: backendtest.PortName(name, "", model.TCP), ClusterIP: netip.MustParseAddr(ip), Port: 80, Protocol: model.TCP, Scheduler: scheduler}
		prev := st.svcs[p.Name]
		s, err := render(model.IPv4, p, &proxier.Targets{Internal: eps, External: eps, HasEndpoints: len(eps) > 0}, prev, ids)
		if err != nil {
			t.Fatal(err)
		}
		b.planTables(s, prev, b.selectionFor(p))
		st.release(p.Name)
		if err := st.admit(p.Name, s, &b.cfg, model.IPv4); err != nil {
			t.Fatal(err)
		}
		return s
	}
	usesTable := func(s *svcState) bool {
		return s.groups[0].maglev && s.fes[0].val.Flags&svcMaglev != 0
	}
	if s := mk("hashed", "10.96.0.1", "maglev", both); !usesTable(s) {
		t.Errorf("random selection, Scheduler maglev: %+v, want a table and the flag", s.fes)
	}
	if s := mk("same", "10.96.0.2", "", both); usesTable(s) || s.groups[0].maglev {
		t.Errorf("random selection, no Scheduler, the same endpoints: %+v uses a table", s.fes)
	}
	if s := mk("ipvs", "10.96.0.3", "mh", both); !usesTable(s) {
		t.Errorf("Scheduler mh: %+v, want a table", s.fes)
	}
	if s := mk("typo", "10.96.0.4", "wrr", both); usesTable(s) {
		t.Errorf("unknown Scheduler with random selection: %+v uses a table", s.fes)
	}
	if w := rec.schedulerWarnings(); len(w) != 1 || w[0]["service"] != backendtest.PortName("typo", "", model.TCP).String() ||
		w[0]["scheduler"] != "wrr" || w[0]["using"] != "random" || !strings.Contains(w[0]["accepted"], "mh, maglev, random") {
		t.Errorf("warnings about the unknown scheduler: %v", w)
	}
	// The same endpoint set has a table per service port that asks
	// for one: tables are per group.
	if st.ntables != 2 || st.svcs[backendtest.PortName("hashed", "", model.TCP)].groups[0].id == st.svcs[backendtest.PortName("ipvs", "", model.TCP)].groups[0].id {
		t.Errorf("%d tables; want one for each of the two service ports asking for Maglev", st.ntables)
	}
	// One table left, then none: the next service port asking for
	// Maglev picks at random.
	if s := mk("third", "10.96.0.5", "maglev", both); !usesTable(s) {
		t.Errorf("the last table: %+v", s.fes)
	}
	if s := mk("fourth", "10.96.0.6", "maglev", both); usesTable(s) || st.noTable != 1 {
		t.Errorf("beyond MaxMaglevTables: %+v, noTable %d; want random selection", s.fes, st.noTable)
	}
	b.warnNoTable(st)
	if w := rec.tablesFullWarnings(); len(w) != 1 || w[0]["servicePorts"] != "1" {
		t.Errorf("warnings about full tables: %v", w)
	}
	// A switch of a live service port: to random frees its table,
	// which the next one asking for Maglev gets.
	old := st.svcs[backendtest.PortName("hashed", "", model.TCP)]
	if s := mk("hashed", "10.96.0.1", "random", both); usesTable(s) || s.groups[0].id != old.groups[0].id {
		t.Errorf("switched to random: %+v", s.fes)
	}
	if s := mk("fourth", "10.96.0.6", "maglev", both); !usesTable(s) {
		t.Errorf("after a table was freed: %+v", s.fes)
	}

	// Maglev selection: "random" opts out, an unknown value and no
	// Scheduler use the proxier's.
	b.cfg.Scheduler = proxier.SchedulerMaglev
	if s := mk("opt-out", "10.96.0.7", "random", both); usesTable(s) {
		t.Errorf("Maglev selection, Scheduler random: %+v uses a table", s.fes)
	}
	st.release(backendtest.PortName("third", "", model.TCP))
	st.release(backendtest.PortName("ipvs", "", model.TCP))
	if s := mk("default", "10.96.0.8", "", both); !usesTable(s) {
		t.Errorf("Maglev selection, no Scheduler: %+v", s.fes)
	}
	if s := mk("typo2", "10.96.0.9", "least-conn", both); !usesTable(s) {
		t.Errorf("Maglev selection, unknown Scheduler: %+v", s.fes)
	}
	if w := rec.schedulerWarnings(); len(w) != 2 || w[1]["scheduler"] != "least-conn" || w[1]["using"] != "mh" {
		t.Errorf("warnings about unknown schedulers: %v", w)
	}
}

// TestSchedulerWarnings: an unknown Scheduler is logged once per
// service port and value, by whichever family backend sees it first;
// again after the value changed, or after it was known or the service
// port gone for a while. A full sync forgets the service ports it no
// longer sees with an unknown value.
func TestSchedulerWarnings(t *testing.T) {
	rec := newLogRecorder(nil)
	warned := newSchedulerWarnings()
	mkBackend := func(f model.IPFamily) *backend {
		return &backend{cfg: Config{}.WithDefaults(), family: f, rows: newRowWriter(DefaultMaglevTableSize, maphash.MakeSeed()),
			warned: warned, log: slog.New(rec).With("family", f.String()), st: newState()}
	}
	b4, b6 := mkBackend(model.IPv4), mkBackend(model.IPv6)
	sp := func(name, scheduler string) *model.ServicePort {
		return &model.ServicePort{Name: backendtest.PortName(name, "", model.UDP), Protocol: model.UDP, Port: 53, Scheduler: scheduler}
	}
	count := func() int { t.Helper(); return len(rec.schedulerWarnings()) }
	for range 3 {
		b4.selectionFor(sp("a", "wrr"))
		b6.selectionFor(sp("a", "wrr"))
	}
	if n := count(); n != 1 {
		t.Fatalf("%d warnings for one value seen by both families three times, want 1", n)
	}
	b6.selectionFor(sp("a", "lc"))
	b4.selectionFor(sp("a", "lc"))
	if n := count(); n != 2 {
		t.Errorf("%d warnings after the value changed, want 2", n)
	}
	b4.selectionFor(sp("b", "lc"))
	if n := count(); n != 3 {
		t.Errorf("%d warnings after another service port used the value, want 3", n)
	}
	// Known for one family only: the other still remembers.
	warned.forget(model.IPv4, backendtest.PortName("a", "", model.UDP))
	b4.selectionFor(sp("a", "lc"))
	if n := count(); n != 3 {
		t.Errorf("%d warnings; a family that forgot the value logged it again while the other remembers", n)
	}
	warned.forget(model.IPv4, backendtest.PortName("a", "", model.UDP))
	warned.forget(model.IPv6, backendtest.PortName("a", "", model.UDP))
	b4.selectionFor(sp("a", "lc"))
	if n := count(); n != 4 {
		t.Errorf("%d warnings after the value was forgotten by both families and came back, want 4", n)
	}

	// Through full syncs (render only): the same state twice, one
	// warning per service port; a service port dropped and back, a new
	// one; a service port fixed, none.
	rec2 := newLogRecorder(nil)
	b := &backend{cfg: Config{}.WithDefaults(), family: model.IPv4, rows: newRowWriter(DefaultMaglevTableSize, maphash.MakeSeed()),
		warned: newSchedulerWarnings(), log: slog.New(rec2), st: newState()}
	x := svc("x", model.UDP, netip.MustParseAddr("10.96.0.1"), 53, netip.MustParseAddrPort("10.244.1.1:53"))
	y := svc("y", model.UDP, netip.MustParseAddr("10.96.0.2"), 53, netip.MustParseAddrPort("10.244.1.1:53"))
	x.Port.Scheduler, y.Port.Scheduler = "bogus", "bogus"
	full := func(svcs ...testSvc) {
		st, errs := b.renderAll(request(model.IPv4, svcs, nil), &kernelState{})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		b.st = st
	}
	full(x, y)
	full(x, y)
	if n := len(rec2.schedulerWarnings()); n != 2 {
		t.Errorf("%d warnings after two full syncs of two service ports with an unknown scheduler, want 2", n)
	}
	full(x)
	full(x, y)
	if n := len(rec2.schedulerWarnings()); n != 3 {
		t.Errorf("%d warnings after a service port left and came back, want 3", n)
	}
	if w := rec2.schedulerWarnings(); w[0]["using"] != "random" || w[0]["service"] != x.Port.Name.String() {
		t.Errorf("warning %v", w[0])
	}
}

func BenchmarkMaglevTable(b *testing.B) {
	eps := endpointSet(1, 10)
	var into []uint32
	for b.Loop() {
		into = maglevTable(eps, DefaultMaglevTableSize, into)
	}
}
