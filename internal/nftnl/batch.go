package nftnl

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file encodes nf_tables messages into one batch (one transaction).
// Expressions are encoded by google/nftables' expr package; the framing
// is done here, for three reasons google/nftables' Conn does not meet at
// scale: it asks the kernel to echo every rule and to acknowledge every
// message (tens of thousands of replies at 10,000 services), it allocates
// set ids from a package global, and it cannot tell which message of a
// failed batch broke.

const (
	nlmsgHdrLen = 16
	// maxElemBytes keeps one NEWSETELEM message well below the 64 KiB
	// limit of its nested element-list attribute.
	maxElemBytes = 48 << 10
	// nftSubsys is the high byte of every nf_tables message type.
	nftSubsys = unix.NFNL_SUBSYS_NFTABLES << 8

	// Kernel constants x/sys/unix lacks (include/uapi/linux/netfilter*).
	nfDrop            = 0
	nfAccept          = 1
	nftSetConcat      = 0x80
	nftaSetDescConcat = 2
	nftaSetFieldLen   = 1
	nftaSetElemKeyEnd = 10
	nlmFNonrec        = 0x100
	// nftDataVerdict is NFT_DATA_VERDICT, the data type of a verdict map.
	nftDataVerdict = 0xffffff00
)

// Verdict codes of [Verdict.Code] (x/sys/unix has NFT_GOTO, NFT_JUMP,
// NFT_RETURN...).
const (
	VerdictDrop   = nfDrop
	VerdictAccept = nfAccept
)

// op is what a message does; with the object's name it makes the label
// of the message in errors, built only when one fails.
type op uint8

const (
	opBatch op = iota
	opAddTable
	opDelTable
	opDelTableIfEmpty
	opAddChain
	opDelChain
	opFlushChain
	opAddRule
	opAddSet
	opDelSet
	opFlushSet
	opAddElems
	opDelElems
)

// label says what a message programs, to name it in errors.
type label struct {
	op    op
	name  string
	owner any
}

func (l label) what() string {
	switch l.op {
	case opAddTable:
		return "add table"
	case opDelTable:
		return "delete table"
	case opDelTableIfEmpty:
		return "delete table if empty"
	case opAddChain:
		return "add chain " + l.name
	case opDelChain:
		return "delete chain " + l.name
	case opFlushChain:
		return "flush chain " + l.name
	case opAddRule:
		return "add rule to chain " + l.name
	case opAddSet:
		return "add set " + l.name
	case opDelSet:
		return "delete set " + l.name
	case opFlushSet:
		return "flush set " + l.name
	case opAddElems:
		return "add elements to " + l.name
	case opDelElems:
		return "delete elements from " + l.name
	}
	return "batch"
}

// Batch is one nf_tables transaction on one table under construction.
// Messages are appended to one buffer; [Conn.Commit] sends it. A batch is
// committed once.
type Batch struct {
	proto  byte
	table  string
	buf    []byte
	start  int     // offset of the message being built
	labels []label // one per message between BATCH_BEGIN and BATCH_END
	owner  any
	err    error
	// elems counts the set elements added and deleted.
	nelems int
}

// NewBatch returns an empty batch on table of family proto (NFPROTO_IPV4,
// NFPROTO_IPV6, ...).
func NewBatch(proto byte, table string) *Batch { return NewBatchSize(proto, table, 16<<10) }

// NewBatchSize is [NewBatch] with room for about size bytes, so that a
// large batch is allocated once.
func NewBatchSize(proto byte, table string, size int) *Batch {
	b := &Batch{proto: proto, table: table, buf: make([]byte, 0, max(size, 64))}
	b.open(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], unix.NFNL_SUBSYS_NFTABLES)
	b.close()
	return b
}

// Proto returns the batch's table family.
func (b *Batch) Proto() byte { return b.proto }

// Table returns the batch's table.
func (b *Batch) Table() string { return b.table }

// Len returns the number of nf_tables messages in the batch.
func (b *Batch) Len() int { return len(b.labels) }

// Elems returns the number of set elements the batch adds or deletes.
func (b *Batch) Elems() int { return b.nelems }

// Size returns the encoded size of the batch in bytes.
func (b *Batch) Size() int { return len(b.buf) }

// Err returns the first error met while building the batch; a batch with
// one is not sent.
func (b *Batch) Err() error { return b.err }

// SetErr records err as the batch's error unless it has one.
func (b *Batch) SetErr(err error) {
	if b.err == nil {
		b.err = err
	}
}

// SetOwner attributes the following messages to owner (nil: to none). A
// [TxFailure] carries the owner of the message it is about, so that the
// caller can tell which of its objects the kernel refused. The value is
// opaque here; a pointer costs no allocation.
func (b *Batch) SetOwner(owner any) { b.owner = owner }

// Bytes returns the encoded messages, BATCH_BEGIN first; BATCH_END is
// added at commit. The slice is the batch's own.
func (b *Batch) Bytes() []byte { return b.buf }

func (b *Batch) open(typ uint16, flags uint16, fam byte) {
	b.start = len(b.buf)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // length, set by close
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, unix.NLM_F_REQUEST|flags)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // seq, set at send
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // port id
	b.buf = append(b.buf, fam, unix.NFNETLINK_V0, 0, 0)
}

func (b *Batch) close() {
	binary.NativeEndian.PutUint32(b.buf[b.start:], uint32(len(b.buf)-b.start))
}

// msg starts an nf_tables message; the caller appends attributes and
// calls close.
func (b *Batch) msg(typ uint16, flags uint16, o op, name string) {
	b.open(nftSubsys|typ, flags, b.proto)
	b.labels = append(b.labels, label{op: o, name: name, owner: b.owner})
}

func (b *Batch) attr(typ uint16, data []byte) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(data)))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, data...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *Batch) str(typ uint16, s string) {
	n := len(s) + 1
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+n))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *Batch) u32(typ uint16, v uint32) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 8)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.BigEndian.AppendUint32(b.buf, v)
}

func (b *Batch) u64(typ uint16, v uint64) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 12)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.BigEndian.AppendUint64(b.buf, v)
}

// nest opens a nested attribute and returns its offset for endNest.
func (b *Batch) nest(typ uint16) int {
	off := len(b.buf)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 0)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ|unix.NLA_F_NESTED)
	return off
}

func (b *Batch) endNest(off int) {
	n := len(b.buf) - off
	if n > 0xffff {
		b.SetErr(fmt.Errorf("netlink attribute of %d bytes exceeds 64 KiB", n))
	}
	binary.NativeEndian.PutUint16(b.buf[off:], uint16(n))
}

// AddTable adds the table (no error if it exists).
func (b *Batch) AddTable() {
	b.msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, opAddTable, "")
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	b.close()
}

// DelTable deletes the table and everything in it; the transaction fails
// with ENOENT if it does not exist.
func (b *Batch) DelTable() {
	b.msg(unix.NFT_MSG_DELTABLE, 0, opDelTable, "")
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.close()
}

// DelTableIfEmpty deletes the table only if it holds nothing (no chain,
// set, object or flowtable: NLM_F_NONREC); the transaction fails with
// EBUSY if it holds something, ENOENT if it does not exist. The check and
// the deletion are one kernel operation.
func (b *Batch) DelTableIfEmpty() {
	b.msg(unix.NFT_MSG_DELTABLE, nlmFNonrec, opDelTableIfEmpty, "")
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.close()
}

// Hook makes a chain a base chain.
type Hook struct {
	// Num is the netfilter hook, e.g. unix.NF_INET_PRE_ROUTING.
	Num uint32
	// Priority orders the chain among others on the hook.
	Priority int32
	// Type is the chain type: "filter", "nat" or "route".
	Type string
}

// AddChain adds a chain (no error if it exists); h nil makes it a regular
// chain, otherwise a base chain with policy accept.
func (b *Batch) AddChain(name string, h *Hook) {
	b.msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, opAddChain, name)
	b.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.str(unix.NFTA_CHAIN_NAME, name)
	if h != nil {
		n := b.nest(unix.NFTA_CHAIN_HOOK)
		b.u32(unix.NFTA_HOOK_HOOKNUM, h.Num)
		b.u32(unix.NFTA_HOOK_PRIORITY, uint32(h.Priority))
		b.endNest(n)
		b.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		b.str(unix.NFTA_CHAIN_TYPE, h.Type)
	}
	b.close()
}

// DelChain deletes a chain, which must have no rules and no references
// (flush it, or delete what jumps to it, earlier in the batch).
func (b *Batch) DelChain(name string) {
	b.msg(unix.NFT_MSG_DELCHAIN, 0, opDelChain, name)
	b.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.str(unix.NFTA_CHAIN_NAME, name)
	b.close()
}

// FlushChain deletes every rule of a chain.
func (b *Batch) FlushChain(name string) {
	b.msg(unix.NFT_MSG_DELRULE, 0, opFlushChain, name)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, name)
	b.close()
}

// AddRule appends a rule to chain; exprs is the encoding of its
// expressions (see [Encode]).
func (b *Batch) AddRule(chain string, exprs []byte) {
	b.msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, opAddRule, chain)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	n := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	b.buf = append(b.buf, exprs...)
	b.endNest(n)
	b.close()
}

// Encode encodes a rule's expressions as the contents of
// NFTA_RULE_EXPRESSIONS, for [Batch.AddRule]. Encode a rule once and add
// it as often as needed.
func Encode(proto byte, exprs []expr.Any) ([]byte, error) {
	var out []byte
	for _, e := range exprs {
		data, err := expr.Marshal(proto, e)
		if err != nil {
			return nil, fmt.Errorf("encode %T: %w", e, err)
		}
		out = binary.NativeEndian.AppendUint16(out, uint16(4+len(data)))
		out = binary.NativeEndian.AppendUint16(out, unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED)
		out = append(out, data...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out, nil
}

// Set describes a named set or map.
type Set struct {
	// Name names the set in its table.
	Name string
	// ID identifies the set within a transaction (NFTA_SET_ID); unique
	// per batch. Rules and elements here refer to sets by name.
	ID uint32
	// Key is the key's datatype; KeyLen its length, 0 meaning Key.Len().
	Key    Datatype
	KeyLen uint32
	// Data makes the set a map: [TypeVerdict] for a verdict map, else
	// the data's datatype; DataLen its length, 0 meaning Data.Len().
	Data    Datatype
	DataLen uint32
	// Interval makes the set hold ranges. An interval set with a
	// concatenated key is described field by field (nft_set_pipapo).
	Interval bool
	// Timeout lets elements carry timeouts.
	Timeout bool
	// Dynamic lets rules update the set from the packet path.
	Dynamic bool
	// Size bounds the number of elements; 0 means no bound.
	Size uint32
	// Comment is shown by nft list.
	Comment string
}

func (s *Set) keyLen() uint32 {
	if s.KeyLen != 0 {
		return s.KeyLen
	}
	return s.Key.Len()
}

func (s *Set) dataLen() uint32 {
	if s.DataLen != 0 || s.Data == TypeVerdict {
		return s.DataLen
	}
	return s.Data.Len()
}

// fields returns the field lengths of a concatenated interval set's key,
// nil for any other set.
func (s *Set) fields() []uint32 {
	if !s.Interval {
		return nil
	}
	if f := s.Key.FieldLens(); len(f) > 1 {
		return f
	}
	return nil
}

// AddSet adds a set or map (no error if one of that name and definition
// exists).
func (b *Batch) AddSet(s *Set) {
	b.msg(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, opAddSet, s.Name)
	b.str(unix.NFTA_SET_TABLE, b.table)
	b.str(unix.NFTA_SET_NAME, s.Name)
	fields := s.fields()
	var flags uint32
	if s.Data != 0 {
		flags |= unix.NFT_SET_MAP
	}
	if s.Interval {
		flags |= unix.NFT_SET_INTERVAL
	}
	if len(fields) > 1 {
		flags |= nftSetConcat
	}
	if s.Timeout {
		flags |= unix.NFT_SET_TIMEOUT
	}
	if s.Dynamic {
		flags |= unix.NFT_SET_EVAL
	}
	b.u32(unix.NFTA_SET_FLAGS, flags)
	b.u32(unix.NFTA_SET_KEY_TYPE, uint32(s.Key))
	b.u32(unix.NFTA_SET_KEY_LEN, s.keyLen())
	b.u32(unix.NFTA_SET_ID, s.ID)
	if s.Data != 0 {
		dt := uint32(s.Data)
		if s.Data == TypeVerdict {
			dt = nftDataVerdict
		}
		b.u32(unix.NFTA_SET_DATA_TYPE, dt)
		b.u32(unix.NFTA_SET_DATA_LEN, s.dataLen())
	}
	if s.Size > 0 || len(fields) > 1 {
		n := b.nest(unix.NFTA_SET_DESC)
		if s.Size > 0 {
			b.u32(unix.NFTA_SET_DESC_SIZE, s.Size)
		}
		if len(fields) > 1 {
			c := b.nest(nftaSetDescConcat)
			for _, l := range fields {
				f := b.nest(unix.NFTA_LIST_ELEM)
				b.u32(nftaSetFieldLen, l)
				b.endNest(f)
			}
			b.endNest(c)
		}
		b.endNest(n)
	}
	// User data nft reads to print the set: key byte order (big endian)
	// and a comment.
	ud := []byte{udataSetKeyByteorder, 4, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(ud[2:], 2)
	if s.Comment != "" {
		ud = append(ud, udataSetComment, byte(len(s.Comment)+1))
		ud = append(ud, s.Comment...)
		ud = append(ud, 0)
	}
	b.attr(unix.NFTA_SET_USERDATA, ud)
	b.close()
}

// Set user data types (libnftnl's NFTNL_UDATA_SET_*).
const (
	udataSetKeyByteorder = 0
	udataSetComment      = 7
)

// DelSet deletes a set no rule refers to.
func (b *Batch) DelSet(name string) {
	b.msg(unix.NFT_MSG_DELSET, 0, opDelSet, name)
	b.str(unix.NFTA_SET_TABLE, b.table)
	b.str(unix.NFTA_SET_NAME, name)
	b.close()
}

// FlushSet deletes every element of a set.
func (b *Batch) FlushSet(name string) {
	b.msg(unix.NFT_MSG_DELSETELEM, 0, opFlushSet, name)
	b.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.str(unix.NFTA_SET_ELEM_LIST_SET, name)
	b.close()
}

// Elem is one set or map element.
type Elem struct {
	// Key is the element's key (its start, in an interval set).
	Key []byte
	// KeyEnd is the last key of a range of a concatenated interval set.
	KeyEnd []byte
	// Val is a map's data; Verdict a verdict map's.
	Val     []byte
	Verdict *Verdict
	// Timeout is the element's own timeout; 0 means the set's.
	Timeout time.Duration
	// IntervalEnd marks the end of a range (the first key after it) in
	// a single-field interval set.
	IntervalEnd bool
}

// Verdict is a verdict map value.
type Verdict struct {
	// Code is unix.NFT_GOTO, unix.NFT_JUMP, [VerdictDrop], ...
	Code int32
	// Chain is the target of a jump or goto.
	Chain string
}

func (e *Elem) encodedLen() int {
	n := 4 + 8 + align4(len(e.Key)) + 8
	if e.KeyEnd != nil {
		n += 8 + align4(len(e.KeyEnd))
	}
	if e.Val != nil {
		n += 8 + align4(len(e.Val))
	}
	if e.Verdict != nil {
		n += 24 + align4(len(e.Verdict.Chain)+1)
	}
	if e.Timeout != 0 {
		n += 12
	}
	if e.IntervalEnd {
		n += 8
	}
	return n
}

// AddElems adds elements to a set, splitting them over as many messages
// as needed.
func (b *Batch) AddElems(set string, elems []Elem) {
	b.elems(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, opAddElems, set, elems)
}

// DelElems deletes elements from a set (by key; data is not sent).
func (b *Batch) DelElems(set string, elems []Elem) {
	b.elems(unix.NFT_MSG_DELSETELEM, 0, opDelElems, set, elems)
}

func (b *Batch) elems(typ uint16, flags uint16, o op, set string, elems []Elem) {
	b.nelems += len(elems)
	for len(elems) > 0 {
		size, n := 0, 0
		for n < len(elems) && size+elems[n].encodedLen() < maxElemBytes {
			size += elems[n].encodedLen()
			n++
		}
		if n == 0 {
			n = 1
		}
		b.msg(typ, flags, o, set)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
		list := b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for i := range elems[:n] {
			b.elem(&elems[i], o == opDelElems)
		}
		b.endNest(list)
		b.close()
		elems = elems[n:]
	}
}

func (b *Batch) elem(e *Elem, keyOnly bool) {
	n := b.nest(unix.NFTA_LIST_ELEM)
	if e.IntervalEnd {
		b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	k := b.nest(unix.NFTA_SET_ELEM_KEY)
	b.attr(unix.NFTA_DATA_VALUE, e.Key)
	b.endNest(k)
	if e.KeyEnd != nil {
		k := b.nest(nftaSetElemKeyEnd)
		b.attr(unix.NFTA_DATA_VALUE, e.KeyEnd)
		b.endNest(k)
	}
	if !keyOnly {
		if e.Timeout != 0 {
			b.u64(unix.NFTA_SET_ELEM_TIMEOUT, uint64(e.Timeout.Milliseconds()))
		}
		switch {
		case e.Verdict != nil:
			d := b.nest(unix.NFTA_SET_ELEM_DATA)
			v := b.nest(unix.NFTA_DATA_VERDICT)
			b.u32(unix.NFTA_VERDICT_CODE, uint32(e.Verdict.Code))
			if e.Verdict.Chain != "" {
				b.str(unix.NFTA_VERDICT_CHAIN, e.Verdict.Chain)
			}
			b.endNest(v)
			b.endNest(d)
		case e.Val != nil:
			d := b.nest(unix.NFTA_SET_ELEM_DATA)
			b.attr(unix.NFTA_DATA_VALUE, e.Val)
			b.endNest(d)
		}
	}
	b.endNest(n)
}

// finish appends BATCH_END and asks for an ack of the last message. It
// returns the offset of that message.
func (b *Batch) finish() int {
	lastStart := b.start
	flags := binary.NativeEndian.Uint16(b.buf[lastStart+6:])
	binary.NativeEndian.PutUint16(b.buf[lastStart+6:], flags|unix.NLM_F_ACK)
	b.open(unix.NFNL_MSG_BATCH_END, 0, 0)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], unix.NFNL_SUBSYS_NFTABLES)
	b.close()
	return lastStart
}

// TxError is a failed transaction: the kernel rejected one or more of its
// messages and applied none of them.
type TxError struct {
	// Failures lists each rejected message.
	Failures []TxFailure
}

// TxFailure is one message the kernel rejected.
type TxFailure struct {
	// What the message did, e.g. "add rule to chain svc-ns/name/tcp/http".
	What string
	// Owner is what [Batch.SetOwner] attributed the message to, if
	// anything; the nftables backend sets the service port it programs
	// (a *model.ServicePortName).
	Owner any
	// Err is the kernel's error number.
	Err error
}

func (e *TxError) Error() string {
	if len(e.Failures) == 0 {
		return "nftables transaction failed"
	}
	f := e.Failures[0]
	s := "nftables transaction failed: " + f.What + ": " + f.Err.Error()
	if len(e.Failures) > 1 {
		s += fmt.Sprintf(" (and %d more)", len(e.Failures)-1)
	}
	return s
}

// Format prints every failure with %+v.
func (e *TxError) Format(st fmt.State, verb rune) {
	if verb != 'v' || !st.Flag('+') {
		fmt.Fprint(st, e.Error())
		return
	}
	var sb strings.Builder
	sb.WriteString("nftables transaction failed:")
	for _, f := range e.Failures {
		sb.WriteString("\n\t" + f.What + ": " + f.Err.Error())
	}
	fmt.Fprint(st, sb.String())
}

// Unwrap returns the kernel errors.
func (e *TxError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// failure returns the failure of message i (0-based) with errno.
func (b *Batch) failure(i int, errno unix.Errno) TxFailure {
	f := TxFailure{What: "batch", Err: errno}
	if i >= 0 && i < len(b.labels) {
		f.What, f.Owner = b.labels[i].what(), b.labels[i].owner
	}
	return f
}

// Label returns what message i (0-based, in the order added) does, as a
// [TxFailure] would name it, and its owner.
func (b *Batch) Label(i int) (what string, owner any) {
	l := b.labels[i]
	return l.what(), l.owner
}
