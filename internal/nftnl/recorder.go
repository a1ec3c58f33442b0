package nftnl

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Recorder is a [Conn] without a kernel: it applies each committed batch
// to a model of the tables it creates, answers queries from that model,
// and records every applied batch as nft-like text, for root-less golden
// tests of what a backend sends.
//
// The text has one line per message, in batch order:
//
//	add table ip proxykit
//	add chain ip proxykit nat-prerouting { type nat hook prerouting priority -100; policy accept; }
//	add map ip proxykit service-ips { type ipv4_addr . inet_proto . inet_service : verdict; comment "..."; }
//	flush chain ip proxykit services
//	add rule ip proxykit services [ payload load 4b @ network header + 16 => reg 8 ] [ lookup reg 8 set service-ips dreg 0 ]
//	add element ip proxykit service-ips { 10.96.0.1 . tcp . 80 : goto cluster-001 }
//	delete chain ip proxykit svc-default/web/tcp
//
// Rule expressions print in libnftnl's debug form (see [Text]); elements
// print decoded by the key and data types of their set, one per line and
// sorted by key when a message holds several.
//
// The model checks what the kernel would refuse for lack of an object
// (ENOENT), a set redefined differently or an element with other data
// (EEXIST), and a table deleted "if empty" that is not (EBUSY); it does
// not track references between chains and sets (a chain or set deleted
// while in use would be EBUSY in the kernel). Reject, when set, lets a test
// make the "kernel" refuse chosen messages. A Recorder is not safe for
// concurrent use.
type Recorder struct {
	// Reject, if set, is asked about each message of a batch; a non-zero
	// errno fails the message, and the transaction, as the kernel would.
	Reject func(m *Message) unix.Errno

	tables  map[tableID]*recTable
	batches []string
}

type tableID struct {
	proto byte
	name  string
}

type recTable struct {
	chains map[string]*recChain
	sets   map[string]*recSet
}

type recChain struct {
	hook   *Hook
	policy uint32
	rules  [][]byte
}

type recSet struct {
	def   *Set
	elems map[string]Elem
}

// NewRecorder returns a recorder with no tables.
func NewRecorder() *Recorder { return &Recorder{tables: map[tableID]*recTable{}} }

// Batches returns the text of every batch applied so far, oldest first.
func (r *Recorder) Batches() []string { return slices.Clone(r.batches) }

// Last returns the text of the last applied batch; empty if none.
func (r *Recorder) Last() string {
	if len(r.batches) == 0 {
		return ""
	}
	return r.batches[len(r.batches)-1]
}

// Clear forgets the recorded batches; the tables stay.
func (r *Recorder) Clear() { r.batches = nil }

// Close implements [Conn]; the model stays readable.
func (r *Recorder) Close() error { return nil }

// Commit implements [Conn]: it applies b to the model, all or nothing,
// and records its text.
func (r *Recorder) Commit(ctx context.Context, b *Batch) error {
	if b.err != nil {
		return b.err
	}
	if len(b.labels) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	msgs, err := DecodeBatch(b.buf)
	if err != nil {
		return err
	}
	next := r.clone()
	var fails []TxFailure
	for i := range msgs {
		errno := next.apply(&msgs[i])
		if errno == 0 && r.Reject != nil {
			errno = r.Reject(&msgs[i])
		}
		if errno != 0 {
			fails = append(fails, b.failure(i, errno))
		}
	}
	if len(fails) > 0 {
		return &TxError{Failures: fails}
	}
	// Elements of sets this batch does not define print by the types
	// the model knows.
	text := textWith(msgs, func(proto byte, table, set string) *Set {
		if s := r.set(proto, table, set); s != nil {
			return s.def
		}
		return nil
	})
	r.tables = next.tables
	r.batches = append(r.batches, text)
	return nil
}

func (r *Recorder) set(proto byte, table, name string) *recSet {
	if t := r.tables[tableID{proto, table}]; t != nil {
		return t.sets[name]
	}
	return nil
}

// clone returns a deep copy of the model.
func (r *Recorder) clone() *Recorder {
	c := &Recorder{tables: make(map[tableID]*recTable, len(r.tables))}
	for id, t := range r.tables {
		nt := &recTable{chains: make(map[string]*recChain, len(t.chains)), sets: make(map[string]*recSet, len(t.sets))}
		for n, ch := range t.chains {
			nt.chains[n] = &recChain{hook: ch.hook, policy: ch.policy, rules: slices.Clone(ch.rules)}
		}
		for n, s := range t.sets {
			nt.sets[n] = &recSet{def: s.def, elems: maps.Clone(s.elems)}
		}
		c.tables[id] = nt
	}
	return c
}

func elemID(e *Elem) string {
	id := string(e.Key) + "\x00" + string(e.KeyEnd)
	if e.IntervalEnd {
		id += "\x00end"
	}
	return id
}

func sameElemData(a, b *Elem) bool {
	if !bytes.Equal(a.Val, b.Val) || (a.Verdict == nil) != (b.Verdict == nil) {
		return false
	}
	return a.Verdict == nil || *a.Verdict == *b.Verdict
}

func sameSetDef(a, b *Set) bool {
	return a.Key == b.Key && a.keyLen() == b.keyLen() && a.Data == b.Data && a.dataLen() == b.dataLen() &&
		a.Interval == b.Interval && a.Timeout == b.Timeout && a.Dynamic == b.Dynamic
}

// apply applies one message to the model and returns the kernel's errno
// for it.
func (r *Recorder) apply(m *Message) unix.Errno {
	id := tableID{m.Proto, m.Table}
	t := r.tables[id]
	if t == nil && m.Type != unix.NFT_MSG_NEWTABLE {
		return unix.ENOENT
	}
	switch m.Type {
	case unix.NFT_MSG_NEWTABLE:
		if t == nil {
			r.tables[id] = &recTable{chains: map[string]*recChain{}, sets: map[string]*recSet{}}
		}
	case unix.NFT_MSG_DELTABLE:
		if m.Flags&nlmFNonrec != 0 && len(t.chains)+len(t.sets) > 0 {
			return unix.EBUSY
		}
		delete(r.tables, id)
	case unix.NFT_MSG_NEWCHAIN:
		if t.chains[m.Name] == nil {
			t.chains[m.Name] = &recChain{hook: m.Hook, policy: m.Policy}
		}
	case unix.NFT_MSG_DELCHAIN:
		// The kernel deletes a chain's rules with it; only a chain
		// others jump to is busy, which the model does not track.
		if t.chains[m.Name] == nil {
			return unix.ENOENT
		}
		delete(t.chains, m.Name)
	case unix.NFT_MSG_DELRULE:
		c := t.chains[m.Name]
		if c == nil {
			return unix.ENOENT
		}
		c.rules = nil
	case unix.NFT_MSG_NEWRULE:
		c := t.chains[m.Name]
		if c == nil {
			return unix.ENOENT
		}
		c.rules = append(c.rules, m.Exprs)
	case unix.NFT_MSG_NEWSET:
		if s := t.sets[m.Name]; s != nil {
			if !sameSetDef(s.def, m.Set) {
				return unix.EEXIST
			}
			return 0
		}
		t.sets[m.Name] = &recSet{def: m.Set, elems: map[string]Elem{}}
	case unix.NFT_MSG_DELSET:
		if t.sets[m.Name] == nil {
			return unix.ENOENT
		}
		delete(t.sets, m.Name)
	case unix.NFT_MSG_NEWSETELEM:
		s := t.sets[m.Name]
		if s == nil {
			return unix.ENOENT
		}
		for i := range m.Elems {
			e := &m.Elems[i]
			k := elemID(e)
			if old, ok := s.elems[k]; ok && !sameElemData(&old, e) {
				return unix.EEXIST
			}
			s.elems[k] = *e
		}
	case unix.NFT_MSG_DELSETELEM:
		s := t.sets[m.Name]
		if s == nil {
			return unix.ENOENT
		}
		if len(m.Elems) == 0 {
			clear(s.elems)
		}
		for i := range m.Elems {
			k := elemID(&m.Elems[i])
			if _, ok := s.elems[k]; !ok {
				return unix.ENOENT
			}
			delete(s.elems, k)
		}
	}
	return 0
}

// TableExists implements [Conn].
func (r *Recorder) TableExists(ctx context.Context, proto byte, table string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return r.tables[tableID{proto, table}] != nil, nil
}

// Chains implements [Conn]; names are sorted.
func (r *Recorder) Chains(ctx context.Context, proto byte, table string) ([]string, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	t := r.tables[tableID{proto, table}]
	if t == nil {
		return nil, false, nil
	}
	return slices.Sorted(maps.Keys(t.chains)), true, nil
}

// Sets implements [Conn]; names are sorted.
func (r *Recorder) Sets(ctx context.Context, proto byte, table string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := r.tables[tableID{proto, table}]
	if t == nil {
		return nil, unix.ENOENT
	}
	return slices.Sorted(maps.Keys(t.sets)), nil
}

// SetElements implements [Conn]; elements are sorted by key.
func (r *Recorder) SetElements(ctx context.Context, proto byte, table, set string) ([]Elem, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := r.set(proto, table, set)
	if s == nil {
		return nil, unix.ENOENT
	}
	out := slices.Collect(maps.Values(s.elems))
	slices.SortFunc(out, compareElems)
	return out, nil
}

func compareElems(a, b Elem) int {
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
}

// List returns what the model holds of a table, in the text of
// [Recorder]: the table, its chains, its sets with their elements, and
// the rules of each chain, every list sorted by name. It is empty when
// the table does not exist.
func (r *Recorder) List(proto byte, table string) string {
	t := r.tables[tableID{proto, table}]
	if t == nil {
		return ""
	}
	msgs := []Message{{Type: unix.NFT_MSG_NEWTABLE, Proto: proto, Table: table}}
	chains := slices.Sorted(maps.Keys(t.chains))
	for _, c := range chains {
		ch := t.chains[c]
		msgs = append(msgs, Message{Type: unix.NFT_MSG_NEWCHAIN, Proto: proto, Table: table, Name: c, Hook: ch.hook, Policy: ch.policy})
	}
	for _, n := range slices.Sorted(maps.Keys(t.sets)) {
		s := t.sets[n]
		msgs = append(msgs, Message{Type: unix.NFT_MSG_NEWSET, Proto: proto, Table: table, Name: n, Set: s.def})
		if len(s.elems) > 0 {
			msgs = append(msgs, Message{Type: unix.NFT_MSG_NEWSETELEM, Proto: proto, Table: table, Name: n,
				Elems: slices.Collect(maps.Values(s.elems))})
		}
	}
	for _, c := range chains {
		for _, e := range t.chains[c].rules {
			msgs = append(msgs, Message{Type: unix.NFT_MSG_NEWRULE, Proto: proto, Table: table, Name: c, Exprs: e})
		}
	}
	return Text(msgs)
}

// textWith is [Text] with a fallback for sets the messages do not define.
func textWith(msgs []Message, known func(proto byte, table, set string) *Set) string {
	sets := map[string]*Set{}
	var sb strings.Builder
	for i := range msgs {
		m := &msgs[i]
		if m.Set != nil {
			sets[setKey(m.Proto, m.Table, m.Name)] = m.Set
		}
		m.format(&sb, func(name string) *Set {
			if s := sets[setKey(m.Proto, m.Table, name)]; s != nil {
				return s
			}
			if known != nil {
				return known(m.Proto, m.Table, name)
			}
			return nil
		})
		sb.WriteByte('\n')
	}
	return sb.String()
}
