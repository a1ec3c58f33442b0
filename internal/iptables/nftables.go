package iptables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// DeleteTableIfEmpty deletes the nf_tables table behind an iptables table
// of the nft flavour (e.g. "ip nat" for iptables' nat) when it holds
// nothing: no chain, set, map, object or flowtable. iptables-nft creates
// such a table on first use and never deletes it, not even when its last
// chain goes; without this, a clean-up would leave an empty "table ip
// nat {}" behind. The check and the deletion are one kernel operation
// (NLM_F_NONREC), so a chain another program adds concurrently is never
// lost. It reports whether the table was deleted; a table in use or
// absent is not an error. For the legacy flavour it does nothing.
func (r *Runner) DeleteTableIfEmpty(ctx context.Context, table string) (bool, error) {
	if r.tools.Flavour != NFT {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	fam := uint8(unix.NFPROTO_IPV4)
	if r.tools.Family == model.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	var deleted bool
	err := r.ns.Do(func() error {
		var err error
		deleted, err = deleteTableNonrec(fam, table)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("delete nf_tables table %s: %w", table, err)
	}
	return deleted, nil
}

// deleteTableNonrec sends one nf_tables batch deleting table, refused by
// the kernel (EBUSY) if the table is in use.
func deleteTableNonrec(family uint8, table string) (bool, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, err
	}
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return false, err
	}
	const seq = 1
	name := append([]byte(table), 0)
	var msg []byte
	msg = appendNfMsg(msg, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, seq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)
	msg = appendNfMsg(msg, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELTABLE,
		unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_NONREC, seq+1, family, 0, nlAttr(unix.NFTA_TABLE_NAME, name))
	msg = appendNfMsg(msg, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, seq+2, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, err
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data[:4])))
			switch {
			case errno == 0 && m.Header.Seq == seq+1:
				return true, nil
			case errno == 0:
				continue
			case errors.Is(errno, unix.EBUSY), errors.Is(errno, unix.ENOENT):
				return false, nil
			default:
				return false, errno
			}
		}
	}
}

// appendNfMsg appends a netlink message with an nfgenmsg header and attrs.
func appendNfMsg(b []byte, typ, flags uint16, seq uint32, family uint8, resID uint16, attrs []byte) []byte {
	length := unix.NLMSG_HDRLEN + 4 + len(attrs)
	b = binary.NativeEndian.AppendUint32(b, uint32(length))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel fills it in
	b = append(b, family, unix.NFNETLINK_V0)
	b = binary.BigEndian.AppendUint16(b, resID)
	return append(b, attrs...)
}

// nlAttr encodes one netlink attribute, padded to 4 bytes.
func nlAttr(typ uint16, data []byte) []byte {
	l := 4 + len(data)
	b := binary.NativeEndian.AppendUint16(nil, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
