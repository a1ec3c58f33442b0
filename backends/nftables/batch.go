package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// This file is the netlink transport: it encodes nf_tables messages into one
// batch (one transaction) and sends it on a NETLINK_NETFILTER socket opened
// in the backend's namespace. Expressions are encoded by google/nftables'
// expr package; the framing is done here, for three reasons the Conn type
// of google/nftables does not meet at scale: it asks the kernel to echo
// every rule and to acknowledge every message (tens of thousands of replies
// at 10,000 services), it allocates set ids from a package global, and it
// cannot tell which message of a failed batch broke.

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
)

// conn is a netlink socket opened in the backend's namespace. The kernel
// processes a batch inside sendto, so every reply is queued when it returns.
type conn struct {
	fd      int
	sndbuf  int // current SO_SNDBUF; raised to fit the largest batch
	recvBuf []byte
	seq     uint32
}

func dial(ns *netns.NS) (*conn, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind netlink socket: %w", err)
	}
	// Errors carry only the header of the failed message, plus the
	// offset of the offending attribute.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	return &conn{fd: fd, recvBuf: make([]byte, 256<<10), seq: uint32(time.Now().Unix())}, nil
}

func (c *conn) close() error {
	if c == nil || c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// label says what a message programs, to name it in errors.
type label struct {
	what string
	svc  *model.ServicePortName // the service port it belongs to, if any
}

// batch is one nf_tables transaction under construction. Messages are
// appended to one buffer; commit sends it with a single sendmsg.
type batch struct {
	fam    byte
	table  string
	buf    []byte
	start  int     // offset of the message being built
	labels []label // one per message between BATCH_BEGIN and BATCH_END
	cur    *model.ServicePortName
	err    error
}

func newBatch(fam byte, table string) *batch { return newBatchSize(fam, table, 16<<10) }

// newBatchSize returns a batch with room for about size bytes.
func newBatchSize(fam byte, table string, size int) *batch {
	b := &batch{fam: fam, table: table, buf: make([]byte, 0, size)}
	b.open(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], unix.NFNL_SUBSYS_NFTABLES)
	b.close()
	return b
}

// Len returns the number of nf_tables messages in the batch.
func (b *batch) Len() int { return len(b.labels) }

// Size returns the encoded size of the batch in bytes.
func (b *batch) Size() int { return len(b.buf) }

// forService attributes the following messages to svc (nil: to none).
func (b *batch) forService(svc *model.ServicePortName) { b.cur = svc }

func (b *batch) open(typ uint16, flags uint16, fam byte) {
	b.start = len(b.buf)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // length, set by close
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, unix.NLM_F_REQUEST|flags)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // seq, set at send
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // port id
	b.buf = append(b.buf, fam, unix.NFNETLINK_V0, 0, 0)
}

func (b *batch) close() {
	binary.NativeEndian.PutUint32(b.buf[b.start:], uint32(len(b.buf)-b.start))
}

// msg starts an nf_tables message; the caller appends attributes and calls
// close.
func (b *batch) msg(typ uint16, flags uint16, what string) {
	b.open(nftSubsys|typ, flags, b.fam)
	b.labels = append(b.labels, label{what: what, svc: b.cur})
}

func align4(n int) int { return (n + 3) &^ 3 }

func (b *batch) attr(typ uint16, data []byte) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+len(data)))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, data...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *batch) str(typ uint16, s string) {
	n := len(s) + 1
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(4+n))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, s...)
	b.buf = append(b.buf, 0)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

func (b *batch) u32(typ uint16, v uint32) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 8)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.BigEndian.AppendUint32(b.buf, v)
}

func (b *batch) u64(typ uint16, v uint64) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 12)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.BigEndian.AppendUint64(b.buf, v)
}

// nest opens a nested attribute and returns its offset for endNest.
func (b *batch) nest(typ uint16) int {
	off := len(b.buf)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 0)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ|unix.NLA_F_NESTED)
	return off
}

func (b *batch) endNest(off int) {
	n := len(b.buf) - off
	if n > 0xffff {
		b.setErr(fmt.Errorf("netlink attribute of %d bytes exceeds 64 KiB", n))
	}
	binary.NativeEndian.PutUint16(b.buf[off:], uint16(n))
}

func (b *batch) setErr(err error) {
	if b.err == nil {
		b.err = err
	}
}

// Table and chain messages.

func (b *batch) addTable() {
	b.msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, "add table")
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	b.close()
}

func (b *batch) delTable() {
	b.msg(unix.NFT_MSG_DELTABLE, 0, "delete table")
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.close()
}

// hook describes a base chain.
type hook struct {
	num      uint32
	priority int32
	typ      string // "filter" or "nat"
}

func (b *batch) addChain(name string, h *hook) {
	b.msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, "add chain "+name)
	b.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.str(unix.NFTA_CHAIN_NAME, name)
	if h != nil {
		n := b.nest(unix.NFTA_CHAIN_HOOK)
		b.u32(unix.NFTA_HOOK_HOOKNUM, h.num)
		b.u32(unix.NFTA_HOOK_PRIORITY, uint32(h.priority))
		b.endNest(n)
		b.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		b.str(unix.NFTA_CHAIN_TYPE, h.typ)
	}
	b.close()
}

func (b *batch) delChain(name string) {
	b.msg(unix.NFT_MSG_DELCHAIN, 0, "delete chain "+name)
	b.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.str(unix.NFTA_CHAIN_NAME, name)
	b.close()
}

func (b *batch) flushChain(name string) {
	b.msg(unix.NFT_MSG_DELRULE, 0, "flush chain "+name)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, name)
	b.close()
}

// addRule appends a rule whose expressions are already encoded (see
// encodeExprs).
func (b *batch) addRule(chain string, exprs []byte) {
	b.msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, "add rule to chain "+chain)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	n := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	b.buf = append(b.buf, exprs...)
	b.endNest(n)
	b.close()
}

// encodeExprs encodes a rule's expressions as the contents of
// NFTA_RULE_EXPRESSIONS.
func encodeExprs(fam byte, exprs []expr.Any) ([]byte, error) {
	var out []byte
	for _, e := range exprs {
		data, err := expr.Marshal(fam, e)
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

// Sets and maps.

// setSpec describes a named set or map.
type setSpec struct {
	name     string
	id       uint32   // NFTA_SET_ID: unique within a transaction
	keyType  uint32   // nft datatype magic (for nft list)
	keyLen   uint32   // bytes
	fields   []uint32 // field lengths of a concatenated interval key
	dataType uint32   // map data type magic; unix.NFT_DATA_VERDICT for vmaps
	dataLen  uint32
	isMap    bool
	interval bool
	timeout  bool // elements carry timeouts
	dynamic  bool // updated from the packet path
	size     uint32
	comment  string
}

func (b *batch) addSet(s *setSpec) {
	b.msg(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, "add set "+s.name)
	b.str(unix.NFTA_SET_TABLE, b.table)
	b.str(unix.NFTA_SET_NAME, s.name)
	var flags uint32
	if s.isMap {
		flags |= unix.NFT_SET_MAP
	}
	if s.interval {
		flags |= unix.NFT_SET_INTERVAL
	}
	if len(s.fields) > 1 {
		flags |= nftSetConcat
	}
	if s.timeout {
		flags |= unix.NFT_SET_TIMEOUT
	}
	if s.dynamic {
		flags |= unix.NFT_SET_EVAL
	}
	b.u32(unix.NFTA_SET_FLAGS, flags)
	b.u32(unix.NFTA_SET_KEY_TYPE, s.keyType)
	b.u32(unix.NFTA_SET_KEY_LEN, s.keyLen)
	b.u32(unix.NFTA_SET_ID, s.id)
	if s.isMap {
		b.u32(unix.NFTA_SET_DATA_TYPE, s.dataType)
		b.u32(unix.NFTA_SET_DATA_LEN, s.dataLen)
	}
	if s.size > 0 || len(s.fields) > 1 {
		n := b.nest(unix.NFTA_SET_DESC)
		if s.size > 0 {
			b.u32(unix.NFTA_SET_DESC_SIZE, s.size)
		}
		if len(s.fields) > 1 {
			c := b.nest(nftaSetDescConcat)
			for _, l := range s.fields {
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
	ud := []byte{0 /* NFTNL_UDATA_SET_KEYBYTEORDER */, 4, 0, 0, 0, 0}
	binary.NativeEndian.PutUint32(ud[2:], 2)
	if s.comment != "" {
		ud = append(ud, 7 /* NFTNL_UDATA_SET_COMMENT */, byte(len(s.comment)+1))
		ud = append(ud, s.comment...)
		ud = append(ud, 0)
	}
	b.attr(unix.NFTA_SET_USERDATA, ud)
	b.close()
}

// elem is one set or map element.
type elem struct {
	key     []byte
	keyEnd  []byte // end of a concatenated interval
	val     []byte // map data
	verdict *verdict
	timeout time.Duration
	// intervalEnd marks the end of a range in a single-field interval
	// set.
	intervalEnd bool
}

// verdict is a verdict map value.
type verdict struct {
	code  int32 // unix.NFT_GOTO, unix.NFT_JUMP, unix.NF_DROP, ...
	chain string
}

func (e *elem) encodedLen() int {
	n := 4 + 8 + align4(len(e.key)) + 8
	if e.keyEnd != nil {
		n += 8 + align4(len(e.keyEnd))
	}
	if e.val != nil {
		n += 8 + align4(len(e.val))
	}
	if e.verdict != nil {
		n += 24 + align4(len(e.verdict.chain)+1)
	}
	if e.timeout != 0 {
		n += 12
	}
	if e.intervalEnd {
		n += 8
	}
	return n
}

// addElems adds elements to set, splitting them over as many messages as
// needed.
func (b *batch) addElems(set string, elems []elem) {
	b.elems(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, set, elems)
}

// delElems deletes elements from set.
func (b *batch) delElems(set string, elems []elem) {
	b.elems(unix.NFT_MSG_DELSETELEM, 0, set, elems)
}

func (b *batch) elems(typ uint16, flags uint16, set string, elems []elem) {
	for len(elems) > 0 {
		size, n := 0, 0
		for n < len(elems) && size+elems[n].encodedLen() < maxElemBytes {
			size += elems[n].encodedLen()
			n++
		}
		if n == 0 {
			n = 1
		}
		what := "add elements to "
		if typ == unix.NFT_MSG_DELSETELEM {
			what = "delete elements from "
		}
		b.msg(typ, flags, what+set)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
		list := b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for i := range elems[:n] {
			b.elem(&elems[i], typ == unix.NFT_MSG_DELSETELEM)
		}
		b.endNest(list)
		b.close()
		elems = elems[n:]
	}
}

func (b *batch) elem(e *elem, keyOnly bool) {
	n := b.nest(unix.NFTA_LIST_ELEM)
	if e.intervalEnd {
		b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	k := b.nest(unix.NFTA_SET_ELEM_KEY)
	b.attr(unix.NFTA_DATA_VALUE, e.key)
	b.endNest(k)
	if e.keyEnd != nil {
		k := b.nest(nftaSetElemKeyEnd)
		b.attr(unix.NFTA_DATA_VALUE, e.keyEnd)
		b.endNest(k)
	}
	if !keyOnly {
		if e.timeout != 0 {
			b.u64(unix.NFTA_SET_ELEM_TIMEOUT, uint64(e.timeout.Milliseconds()))
		}
		switch {
		case e.verdict != nil:
			d := b.nest(unix.NFTA_SET_ELEM_DATA)
			v := b.nest(unix.NFTA_DATA_VERDICT)
			b.u32(unix.NFTA_VERDICT_CODE, uint32(e.verdict.code))
			if e.verdict.chain != "" {
				b.str(unix.NFTA_VERDICT_CHAIN, e.verdict.chain)
			}
			b.endNest(v)
			b.endNest(d)
		case e.val != nil:
			d := b.nest(unix.NFTA_SET_ELEM_DATA)
			b.attr(unix.NFTA_DATA_VALUE, e.val)
			b.endNest(d)
		}
	}
	b.endNest(n)
}

// flushSet deletes every element of set.
// delSet deletes a set no rule refers to.
func (b *batch) delSet(set string) {
	b.msg(unix.NFT_MSG_DELSET, 0, "delete set "+set)
	b.str(unix.NFTA_SET_TABLE, b.table)
	b.str(unix.NFTA_SET_NAME, set)
	b.close()
}

func (b *batch) flushSet(set string) {
	b.msg(unix.NFT_MSG_DELSETELEM, 0, "flush set "+set)
	b.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
	b.close()
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
	// Service is the service port the message programs, if any.
	Service *model.ServicePortName
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

// commit sends the batch as one transaction and waits for the kernel's
// verdict. It returns nil if the kernel applied the whole batch, a
// *TxError if it rejected it (and applied nothing).
func (c *conn) commit(b *batch) error {
	if b.err != nil {
		return b.err
	}
	if len(b.labels) == 0 {
		return nil
	}
	// Ask for an ack on the last message only: errors are reported for
	// every failing message anyway, before that ack.
	lastStart := b.start
	flags := binary.NativeEndian.Uint16(b.buf[lastStart+6:])
	binary.NativeEndian.PutUint16(b.buf[lastStart+6:], flags|unix.NLM_F_ACK)
	b.open(unix.NFNL_MSG_BATCH_END, 0, 0)
	binary.BigEndian.PutUint16(b.buf[len(b.buf)-2:], unix.NFNL_SUBSYS_NFTABLES)
	b.close()

	// Number the messages.
	base := c.seq + 1
	var lastSeq uint32
	for off, i := 0, uint32(0); off < len(b.buf); i++ {
		l := int(binary.NativeEndian.Uint32(b.buf[off:]))
		binary.NativeEndian.PutUint32(b.buf[off+8:], base+i)
		if off == lastStart {
			lastSeq = base + i
		}
		off += align4(l)
		c.seq = base + i
	}

	if need := len(b.buf) + 64<<10; need > c.sndbuf {
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, need); err != nil {
			if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, need); err != nil {
				return fmt.Errorf("netlink send buffer: %w", err)
			}
		}
		c.sndbuf = need
	}
	if err := unix.Sendto(c.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send nftables batch of %d bytes: %w", len(b.buf), err)
	}

	// The kernel processes the batch inside sendto, so every reply is
	// queued by now; poll only as a safety net.
	var fails []TxFailure
	for {
		n, err := c.recv()
		if err != nil {
			return fmt.Errorf("receive nftables reply: %w", err)
		}
		done := false
		for off := 0; off+nlmsgHdrLen <= n; {
			l := int(binary.NativeEndian.Uint32(c.recvBuf[off:]))
			if l < nlmsgHdrLen || off+l > n {
				break
			}
			typ := binary.NativeEndian.Uint16(c.recvBuf[off+4:])
			if typ == unix.NLMSG_ERROR && l >= nlmsgHdrLen+4+nlmsgHdrLen {
				errno := -int32(binary.NativeEndian.Uint32(c.recvBuf[off+nlmsgHdrLen:]))
				origSeq := binary.NativeEndian.Uint32(c.recvBuf[off+nlmsgHdrLen+4+8:])
				if errno != 0 {
					f := TxFailure{What: "batch", Err: unix.Errno(errno)}
					if i := int(origSeq) - int(base) - 1; i >= 0 && i < len(b.labels) {
						f.What, f.Service = b.labels[i].what, b.labels[i].svc
					}
					fails = append(fails, f)
				}
				if origSeq == lastSeq || origSeq == base {
					// The ack of the last message, or an error
					// about the batch as a whole.
					done = true
				}
			}
			off += align4(l)
		}
		if done {
			break
		}
	}
	if len(fails) > 0 {
		return &TxError{Failures: fails}
	}
	return nil
}

// recv reads one datagram, waiting at most 10 s.
func (c *conn) recv() (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _, err := unix.Recvfrom(c.fd, c.recvBuf, unix.MSG_DONTWAIT)
		if err == nil {
			return n, nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if !errors.Is(err, unix.EAGAIN) {
			return 0, err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return 0, errors.New("no reply from the kernel")
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, err
		}
	}
}

// query sends one request (a get or a dump) and hands each reply to it,
// with its type and body, until the kernel ends the answer: an error
// message (errno 0 is an ack), or NLMSG_DONE, reported as errno 0.
func (c *conn) query(typ, flags uint16, fam byte, attrs func(*batch), reply func(typ uint16, body []byte)) (errno unix.Errno, err error) {
	b := &batch{fam: fam}
	b.open(nftSubsys|typ, flags, fam)
	attrs(b)
	b.close()
	c.seq++
	seq := c.seq
	binary.NativeEndian.PutUint32(b.buf[8:], seq)
	if err := unix.Sendto(c.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	for {
		n, err := c.recv()
		if err != nil {
			return 0, err
		}
		for off := 0; off+nlmsgHdrLen <= n; {
			l := int(binary.NativeEndian.Uint32(c.recvBuf[off:]))
			if l < nlmsgHdrLen || off+l > n {
				break
			}
			typ := binary.NativeEndian.Uint16(c.recvBuf[off+4:])
			if binary.NativeEndian.Uint32(c.recvBuf[off+8:]) == seq {
				switch typ {
				case unix.NLMSG_DONE:
					return 0, nil
				case unix.NLMSG_ERROR:
					return unix.Errno(-int32(binary.NativeEndian.Uint32(c.recvBuf[off+nlmsgHdrLen:]))), nil
				default:
					reply(typ, c.recvBuf[off+nlmsgHdrLen:off+l])
				}
			}
			off += align4(l)
		}
	}
}

// tableExists asks the kernel whether the table exists: the one read a
// full sync does.
func (c *conn) tableExists(fam byte, table string) (bool, error) {
	found := false
	errno, err := c.query(unix.NFT_MSG_GETTABLE, unix.NLM_F_ACK, fam,
		func(b *batch) { b.str(unix.NFTA_TABLE_NAME, table) },
		func(typ uint16, _ []byte) { found = found || typ == nftSubsys|unix.NFT_MSG_NEWTABLE })
	switch {
	case err != nil:
		return false, err
	case errno == unix.ENOENT:
		return false, nil
	case errno != 0:
		return false, errno
	}
	return found, nil
}

// chains lists the names of the table's chains, and reports whether the
// table exists: what a first sync needs to take over a table that an
// earlier process filled.
func (c *conn) chains(fam byte, table string) (names []string, exists bool, err error) {
	if exists, err = c.tableExists(fam, table); err != nil || !exists {
		return nil, exists, err
	}
	names, err = c.list(unix.NFT_MSG_GETCHAIN, unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, fam, table)
	if err != nil {
		return nil, true, fmt.Errorf("list chains: %w", err)
	}
	return names, true, nil
}

// sets lists the names of the table's sets and maps.
func (c *conn) sets(fam byte, table string) ([]string, error) {
	names, err := c.list(unix.NFT_MSG_GETSET, unix.NFT_MSG_NEWSET, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, fam, table)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	return names, nil
}

// list dumps the objects of one type (chains or sets) of a table and
// returns their names: get is the dump request, reply the type of each
// answer, tableAttr and nameAttr the attributes that carry the table's
// and the object's names.
func (c *conn) list(get, reply uint16, tableAttr, nameAttr uint16, fam byte, table string) ([]string, error) {
	var names []string
	var derr error
	errno, err := c.query(get, unix.NLM_F_DUMP, fam,
		func(b *batch) { b.str(tableAttr, table) },
		func(typ uint16, body []byte) {
			if typ != nftSubsys|reply || len(body) < 4 {
				return
			}
			// Attributes follow the nfgenmsg header.
			ad, err := netlink.NewAttributeDecoder(body[4:])
			if err != nil {
				derr = err
				return
			}
			var tbl, name string
			for ad.Next() {
				switch ad.Type() {
				case tableAttr:
					tbl = ad.String()
				case nameAttr:
					name = ad.String()
				}
			}
			if tbl == table && name != "" {
				names = append(names, name)
			}
		})
	switch {
	case err != nil:
		return nil, err
	case derr != nil:
		return nil, derr
	case errno != 0:
		return nil, errno
	}
	return names, nil
}

// be32 encodes v big endian.
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
