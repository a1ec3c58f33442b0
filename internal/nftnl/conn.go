package nftnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
)

// Conn commits batches and answers the queries the backends make. Both
// [NetlinkConn] (the kernel) and [Recorder] (a model in memory) implement
// it.
type Conn interface {
	// Commit sends b as one transaction and waits for the verdict. It
	// returns nil if the whole batch was applied, a *[TxError] if
	// messages were rejected (and nothing applied), or another error
	// (nothing known). ctx is checked before sending; once sent, the
	// verdict is always read.
	Commit(ctx context.Context, b *Batch) error
	// TableExists reports whether the table exists.
	TableExists(ctx context.Context, proto byte, table string) (bool, error)
	// Chains returns the names of the table's chains and whether the
	// table exists.
	Chains(ctx context.Context, proto byte, table string) (names []string, exists bool, err error)
	// Sets returns the names of the table's sets and maps.
	Sets(ctx context.Context, proto byte, table string) ([]string, error)
	// SetElements returns the elements of a set (key, key end, interval
	// end flag and data); the error matches unix.ENOENT when the table
	// or the set does not exist.
	SetElements(ctx context.Context, proto byte, table, set string) ([]Elem, error)
	// Close releases the connection.
	Close() error
}

var (
	_ Conn = (*NetlinkConn)(nil)
	_ Conn = (*Recorder)(nil)
)

// NetlinkConn is a NETLINK_NETFILTER socket opened in a network
// namespace. The kernel processes a batch inside sendto, so every reply
// is queued when it returns.
type NetlinkConn struct {
	fd      int
	sndbuf  int // current SO_SNDBUF; raised to fit the largest batch
	recvBuf []byte
	seq     uint32
}

// Dial opens a netfilter netlink socket in ns. The socket is bound to ns
// for its lifetime; the calling thread's namespace is not changed.
func Dial(ns *netns.NS) (*NetlinkConn, error) {
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
	return &NetlinkConn{fd: fd, recvBuf: make([]byte, 256<<10), seq: uint32(time.Now().Unix())}, nil
}

// Close closes the socket. It may be called more than once.
func (c *NetlinkConn) Close() error {
	if c == nil || c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// Commit implements [Conn]. Only the last message asks for an ack: the
// kernel reports every failing message anyway, before that ack.
func (c *NetlinkConn) Commit(ctx context.Context, b *Batch) error {
	if b.err != nil {
		return b.err
	}
	if len(b.labels) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	lastStart := b.finish()

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
					fails = append(fails, b.failure(int(origSeq)-int(base)-1, unix.Errno(errno)))
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

// recv reads one datagram, waiting at most 10 s: the kernel answers
// within the sendto that asked, so waiting is only a safety net.
func (c *NetlinkConn) recv() (int, error) {
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
// with its type and attributes (after the nfgenmsg header), until the
// kernel ends the answer: an error message (errno 0 is an ack), or
// NLMSG_DONE, reported as errno 0.
func (c *NetlinkConn) query(ctx context.Context, typ, flags uint16, proto byte, attrs func(*Batch), reply func(typ uint16, attrs []byte)) (errno unix.Errno, err error) {
	return c.exchange(ctx, typ, flags, proto, attrs, false, func(typ, _ uint16, attrs []byte) { reply(typ, attrs) })
}

// exchange is query, handing reply each message's flags too; with
// watch, ctx is checked before each datagram is read, so a long dump
// stops when ctx ends (the caller must then close the connection: the
// rest of the dump is still queued).
func (c *NetlinkConn) exchange(ctx context.Context, typ, flags uint16, proto byte, attrs func(*Batch), watch bool, reply func(typ, flags uint16, attrs []byte)) (errno unix.Errno, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b := &Batch{proto: proto}
	b.open(nftSubsys|typ, flags, proto)
	attrs(b)
	b.close()
	c.seq++
	seq := c.seq
	binary.NativeEndian.PutUint32(b.buf[8:], seq)
	if err := unix.Sendto(c.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	for {
		if watch {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
		}
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
			msgFlags := binary.NativeEndian.Uint16(c.recvBuf[off+6:])
			if binary.NativeEndian.Uint32(c.recvBuf[off+8:]) == seq {
				switch typ {
				case unix.NLMSG_DONE:
					return 0, nil
				case unix.NLMSG_ERROR:
					return unix.Errno(-int32(binary.NativeEndian.Uint32(c.recvBuf[off+nlmsgHdrLen:]))), nil
				default:
					if l >= nlmsgHdrLen+4 {
						reply(typ, msgFlags, c.recvBuf[off+nlmsgHdrLen+4:off+l])
					}
				}
			}
			off += align4(l)
		}
	}
}

// TableExists implements [Conn]: one GETTABLE.
func (c *NetlinkConn) TableExists(ctx context.Context, proto byte, table string) (bool, error) {
	found := false
	errno, err := c.query(ctx, unix.NFT_MSG_GETTABLE, unix.NLM_F_ACK, proto,
		func(b *Batch) { b.str(unix.NFTA_TABLE_NAME, table) },
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

// ChainExists reports whether the table holds the chain: one GETCHAIN
// of that chain, which costs the same however many chains the table
// holds (a dump of them does not).
func (c *NetlinkConn) ChainExists(ctx context.Context, proto byte, table, chain string) (bool, error) {
	found := false
	errno, err := c.query(ctx, unix.NFT_MSG_GETCHAIN, unix.NLM_F_ACK, proto,
		func(b *Batch) {
			b.str(unix.NFTA_CHAIN_TABLE, table)
			b.str(unix.NFTA_CHAIN_NAME, chain)
		},
		func(typ uint16, _ []byte) { found = found || typ == nftSubsys|unix.NFT_MSG_NEWCHAIN })
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

// ChainsByTable returns the names of the chains of every table of family
// proto, by table: one dump, where [NetlinkConn.Chains] of each table
// costs a dump of the family's chains each (the kernel walks all of them
// for each).
func (c *NetlinkConn) ChainsByTable(ctx context.Context, proto byte) (map[string][]string, error) {
	byTable, _, err := c.chainsByTable(ctx, proto, false)
	return byTable, err
}

// ChainsByTableChecked is [NetlinkConn.ChainsByTable] for a caller that
// lists while other programs (or itself) may change the tables: it
// reports whether the kernel flagged the dump as interrupted by a
// change (NLM_F_DUMP_INTR), in which case a chain may be missing from
// the list or listed twice, and it checks ctx between datagrams, so that
// a dump of many chains stops when ctx ends (the connection must then be
// closed). The dump costs the kernel time quadratic in the family's
// chains: each ~32 KB datagram restarts the walk from the first chain.
func (c *NetlinkConn) ChainsByTableChecked(ctx context.Context, proto byte) (byTable map[string][]string, interrupted bool, err error) {
	return c.chainsByTable(ctx, proto, true)
}

func (c *NetlinkConn) chainsByTable(ctx context.Context, proto byte, watch bool) (byTable map[string][]string, interrupted bool, err error) {
	out := map[string][]string{}
	var derr error
	errno, err := c.exchange(ctx, unix.NFT_MSG_GETCHAIN, unix.NLM_F_DUMP, proto, func(*Batch) {}, watch,
		func(typ, flags uint16, attrs []byte) {
			interrupted = interrupted || flags&unix.NLM_F_DUMP_INTR != 0
			if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || typ&0xff != unix.NFT_MSG_NEWCHAIN {
				return
			}
			m, err := decodeMessage(typ&0xff, 0, proto, attrs)
			if err != nil {
				derr = errors.Join(derr, err)
				return
			}
			out[m.Table] = append(out[m.Table], m.Name)
		})
	switch {
	case err != nil:
		return nil, false, err
	case derr != nil:
		return nil, false, derr
	case errno != 0:
		return nil, false, errno
	}
	return out, interrupted, nil
}

// Chains implements [Conn].
func (c *NetlinkConn) Chains(ctx context.Context, proto byte, table string) (names []string, exists bool, err error) {
	if exists, err = c.TableExists(ctx, proto, table); err != nil || !exists {
		return nil, exists, err
	}
	msgs, err := c.dump(ctx, unix.NFT_MSG_GETCHAIN, proto, table, "")
	if err != nil {
		return nil, true, fmt.Errorf("list chains: %w", err)
	}
	for _, m := range msgs {
		names = append(names, m.Name)
	}
	return names, true, nil
}

// Sets implements [Conn].
func (c *NetlinkConn) Sets(ctx context.Context, proto byte, table string) ([]string, error) {
	msgs, err := c.dump(ctx, unix.NFT_MSG_GETSET, proto, table, "")
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	var names []string
	for _, m := range msgs {
		names = append(names, m.Name)
	}
	return names, nil
}

// SetElements implements [Conn].
func (c *NetlinkConn) SetElements(ctx context.Context, proto byte, table, set string) ([]Elem, error) {
	msgs, err := c.dump(ctx, unix.NFT_MSG_GETSETELEM, proto, table, set)
	if err != nil {
		return nil, fmt.Errorf("list elements of set %s: %w", set, err)
	}
	var out []Elem
	for _, m := range msgs {
		out = append(out, m.Elems...)
	}
	return out, nil
}

// dump asks for every object of one kind (chains, sets, rules, or the
// elements of set) of table and decodes the replies.
func (c *NetlinkConn) dump(ctx context.Context, get uint16, proto byte, table, set string) ([]Message, error) {
	var msgs []Message
	var derr error
	errno, err := c.query(ctx, get, unix.NLM_F_DUMP, proto,
		func(b *Batch) {
			switch get {
			case unix.NFT_MSG_GETSETELEM:
				b.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
				b.str(unix.NFTA_SET_ELEM_LIST_SET, set)
			default:
				// NFTA_CHAIN_TABLE, NFTA_SET_TABLE and
				// NFTA_RULE_TABLE are all 1.
				b.str(unix.NFTA_CHAIN_TABLE, table)
			}
		},
		func(typ uint16, attrs []byte) {
			if typ>>8 != unix.NFNL_SUBSYS_NFTABLES {
				return
			}
			m, err := decodeMessage(typ&0xff, 0, proto, attrs)
			if err != nil {
				derr = errors.Join(derr, err)
				return
			}
			// An element dump may end with a message without
			// elements.
			if m.Table == table && (m.Type != unix.NFT_MSG_NEWSETELEM || len(m.Elems) > 0) {
				msgs = append(msgs, m)
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
	return msgs, nil
}

// List returns the table's contents as nft-like text, one line per
// object (see [Text]): its chains, its sets with their elements, and the
// rules of each chain, chains and sets sorted by name, as
// [Recorder.List] prints its model. A table that does not exist gives an
// error matching unix.ENOENT.
func (c *NetlinkConn) List(ctx context.Context, proto byte, table string) (string, error) {
	exists, err := c.TableExists(ctx, proto, table)
	if err != nil {
		return "", err
	}
	if !exists {
		return "", fmt.Errorf("table %s %s: %w", protoName(proto), table, unix.ENOENT)
	}
	msgs := []Message{{Type: unix.NFT_MSG_NEWTABLE, Proto: proto, Table: table}}
	chains, err := c.dump(ctx, unix.NFT_MSG_GETCHAIN, proto, table, "")
	if err != nil {
		return "", err
	}
	sets, err := c.dump(ctx, unix.NFT_MSG_GETSET, proto, table, "")
	if err != nil {
		return "", err
	}
	byName := func(a, b Message) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(chains, byName)
	slices.SortFunc(sets, byName)
	msgs = append(msgs, chains...)
	for _, s := range sets {
		msgs = append(msgs, s)
		els, err := c.dump(ctx, unix.NFT_MSG_GETSETELEM, proto, table, s.Name)
		if err != nil {
			return "", err
		}
		msgs = append(msgs, els...)
	}
	rules, err := c.dump(ctx, unix.NFT_MSG_GETRULE, proto, table, "")
	if err != nil {
		return "", err
	}
	slices.SortStableFunc(rules, byName)
	msgs = append(msgs, rules...)
	return Text(msgs), nil
}
