package nftnl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file turns nf_tables messages back into values and text: the
// messages of a batch (what the recorder shows) and the replies of a dump
// (what the kernel holds).

// Message is one decoded nf_tables message.
type Message struct {
	// Type is the message type without the subsystem, unix.NFT_MSG_*.
	Type uint16
	// Flags are the netlink flags (NLM_F_*).
	Flags uint16
	// Proto is the table family.
	Proto byte
	// Table names the table.
	Table string
	// Name names the chain (chain messages, and a rule's chain), the set
	// (set and element messages) or is empty (table messages).
	Name string
	// Hook is a base chain's hook; Policy its policy (VerdictAccept or
	// VerdictDrop).
	Hook   *Hook
	Policy uint32
	// Set is the definition of a new set.
	Set *Set
	// Elems are the elements of an element message; none in an element
	// deletion means a flush.
	Elems []Elem
	// Exprs is the encoded expression list of a rule.
	Exprs []byte
	// Handle is the handle of a rule, chain or table, when present.
	Handle uint64
}

// DecodeBatch decodes the nf_tables messages of an encoded batch (or of
// any run of netlink messages), skipping the batch delimiters.
func DecodeBatch(buf []byte) ([]Message, error) {
	var out []Message
	for off := 0; off+nlmsgHdrLen <= len(buf); {
		l := int(binary.NativeEndian.Uint32(buf[off:]))
		if l < nlmsgHdrLen+4 || off+l > len(buf) {
			return out, fmt.Errorf("bad netlink message length %d at offset %d", l, off)
		}
		typ := binary.NativeEndian.Uint16(buf[off+4:])
		flags := binary.NativeEndian.Uint16(buf[off+6:])
		if typ>>8 == unix.NFNL_SUBSYS_NFTABLES {
			m, err := decodeMessage(typ&0xff, flags, buf[off+nlmsgHdrLen], buf[off+nlmsgHdrLen+4:off+l])
			if err != nil {
				return out, err
			}
			out = append(out, m)
		}
		off += align4(l)
	}
	return out, nil
}

func decodeMessage(typ, flags uint16, proto byte, attrs []byte) (Message, error) {
	m := Message{Type: typ, Flags: flags, Proto: proto}
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return m, err
	}
	ad.ByteOrder = binary.BigEndian
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				m.Table = ad.String()
			}
		}
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		var typName string
		m.Policy = nfAccept
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_CHAIN_TABLE:
				m.Table = ad.String()
			case unix.NFTA_CHAIN_NAME:
				m.Name = ad.String()
			case unix.NFTA_CHAIN_HANDLE:
				m.Handle = ad.Uint64()
			case unix.NFTA_CHAIN_HOOK:
				h := &Hook{}
				ad.Nested(func(nd *netlink.AttributeDecoder) error {
					nd.ByteOrder = binary.BigEndian
					for nd.Next() {
						switch nd.Type() {
						case unix.NFTA_HOOK_HOOKNUM:
							h.Num = nd.Uint32()
						case unix.NFTA_HOOK_PRIORITY:
							h.Priority = int32(nd.Uint32())
						}
					}
					return nil
				})
				m.Hook = h
			case unix.NFTA_CHAIN_POLICY:
				m.Policy = ad.Uint32()
			case unix.NFTA_CHAIN_TYPE:
				typName = ad.String()
			}
		}
		if m.Hook != nil {
			m.Hook.Type = typName
		}
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_TABLE:
				m.Table = ad.String()
			case unix.NFTA_RULE_CHAIN:
				m.Name = ad.String()
			case unix.NFTA_RULE_HANDLE:
				m.Handle = ad.Uint64()
			case unix.NFTA_RULE_EXPRESSIONS:
				m.Exprs = ad.Bytes()
			}
		}
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		s := &Set{}
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_TABLE:
				m.Table = ad.String()
			case unix.NFTA_SET_NAME:
				m.Name = ad.String()
				s.Name = m.Name
			case unix.NFTA_SET_FLAGS:
				f := ad.Uint32()
				s.Interval = f&unix.NFT_SET_INTERVAL != 0
				s.Timeout = f&unix.NFT_SET_TIMEOUT != 0
				s.Dynamic = f&unix.NFT_SET_EVAL != 0
				if f&unix.NFT_SET_MAP != 0 && s.Data == 0 {
					s.Data = TypeVerdict // until the data type says more
				}
			case unix.NFTA_SET_KEY_TYPE:
				s.Key = Datatype(ad.Uint32())
			case unix.NFTA_SET_KEY_LEN:
				s.KeyLen = ad.Uint32()
			case unix.NFTA_SET_ID:
				s.ID = ad.Uint32()
			case unix.NFTA_SET_DATA_TYPE:
				if dt := ad.Uint32(); dt == nftDataVerdict {
					s.Data = TypeVerdict
				} else {
					s.Data = Datatype(dt)
				}
			case unix.NFTA_SET_DATA_LEN:
				s.DataLen = ad.Uint32()
			case unix.NFTA_SET_DESC:
				ad.Nested(func(nd *netlink.AttributeDecoder) error {
					nd.ByteOrder = binary.BigEndian
					for nd.Next() {
						if nd.Type() == unix.NFTA_SET_DESC_SIZE {
							s.Size = nd.Uint32()
						}
					}
					return nil
				})
			case unix.NFTA_SET_USERDATA:
				s.Comment = setComment(ad.Bytes())
			}
		}
		if typ == unix.NFT_MSG_NEWSET {
			m.Set = s
		}
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_ELEM_LIST_TABLE:
				m.Table = ad.String()
			case unix.NFTA_SET_ELEM_LIST_SET:
				m.Name = ad.String()
			case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
				ad.Nested(func(nd *netlink.AttributeDecoder) error {
					for nd.Next() {
						var e Elem
						nd.Nested(func(ed *netlink.AttributeDecoder) error {
							decodeElem(ed, &e)
							return nil
						})
						m.Elems = append(m.Elems, e)
					}
					return nil
				})
			}
		}
	}
	if err := ad.Err(); err != nil {
		return m, fmt.Errorf("decode nf_tables message %d: %w", typ, err)
	}
	return m, nil
}

func decodeElem(ed *netlink.AttributeDecoder, e *Elem) {
	ed.ByteOrder = binary.BigEndian
	value := func() []byte {
		var v []byte
		ed.Nested(func(vd *netlink.AttributeDecoder) error {
			for vd.Next() {
				if vd.Type() == unix.NFTA_DATA_VALUE {
					v = vd.Bytes()
				}
			}
			return nil
		})
		return v
	}
	for ed.Next() {
		switch ed.Type() {
		case unix.NFTA_SET_ELEM_FLAGS:
			e.IntervalEnd = ed.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_KEY:
			e.Key = value()
		case nftaSetElemKeyEnd:
			e.KeyEnd = value()
		case unix.NFTA_SET_ELEM_TIMEOUT:
			e.Timeout = time.Duration(ed.Uint64()) * time.Millisecond
		case unix.NFTA_SET_ELEM_DATA:
			ed.Nested(func(dd *netlink.AttributeDecoder) error {
				dd.ByteOrder = binary.BigEndian
				for dd.Next() {
					switch dd.Type() {
					case unix.NFTA_DATA_VALUE:
						e.Val = dd.Bytes()
					case unix.NFTA_DATA_VERDICT:
						e.Verdict = decodeVerdict(dd)
					}
				}
				return nil
			})
		}
	}
}

func decodeVerdict(ad *netlink.AttributeDecoder) *Verdict {
	v := &Verdict{}
	ad.Nested(func(vd *netlink.AttributeDecoder) error {
		vd.ByteOrder = binary.BigEndian
		for vd.Next() {
			switch vd.Type() {
			case unix.NFTA_VERDICT_CODE:
				v.Code = int32(vd.Uint32())
			case unix.NFTA_VERDICT_CHAIN:
				v.Chain = vd.String()
			}
		}
		return nil
	})
	return v
}

// setComment returns the comment of a set's user data.
func setComment(ud []byte) string {
	for len(ud) >= 2 {
		t, l := ud[0], int(ud[1])
		if 2+l > len(ud) {
			break
		}
		if t == udataSetComment {
			return strings.TrimRight(string(ud[2:2+l]), "\x00")
		}
		ud = ud[2+l:]
	}
	return ""
}

// Text renders messages as nft-like text, one line per message (an
// element message with several elements spans one line per element,
// sorted by key). Elements are decoded by the key and data types of the
// sets the messages define; a set defined elsewhere prints its elements
// in hex. See [Recorder] for the format.
func Text(msgs []Message) string { return textWith(msgs, nil) }

func setKey(proto byte, table, set string) string {
	return string(proto) + table + "\x00" + set
}

// format writes m as one line of text (or several, for elements); sets
// looks up set definitions by name.
func (m *Message) format(sb *strings.Builder, sets func(string) *Set) {
	obj := func(verb, kind string) {
		sb.WriteString(verb + " " + kind + " " + protoName(m.Proto) + " " + m.Table)
		if m.Name != "" {
			sb.WriteString(" " + m.Name)
		}
	}
	switch m.Type {
	case unix.NFT_MSG_NEWTABLE:
		obj("add", "table")
	case unix.NFT_MSG_DELTABLE:
		obj("delete", "table")
		if m.Flags&nlmFNonrec != 0 {
			sb.WriteString(" # only if empty")
		}
	case unix.NFT_MSG_NEWCHAIN:
		obj("add", "chain")
		if h := m.Hook; h != nil {
			fmt.Fprintf(sb, " { type %s hook %s priority %d; policy %s; }", h.Type, hookName(h.Num), h.Priority,
				verdictText(&Verdict{Code: int32(m.Policy)}))
		}
	case unix.NFT_MSG_DELCHAIN:
		obj("delete", "chain")
	case unix.NFT_MSG_DELRULE:
		if m.Handle == 0 {
			obj("flush", "chain")
			return
		}
		obj("delete", "rule")
		fmt.Fprintf(sb, " handle %d", m.Handle)
	case unix.NFT_MSG_NEWRULE:
		obj("add", "rule")
		sb.WriteByte(' ')
		if err := formatExprs(sb, m.Exprs); err != nil {
			sb.WriteString(" # " + err.Error())
		}
	case unix.NFT_MSG_NEWSET:
		kind := "set"
		if m.Set.Data != 0 {
			kind = "map"
		}
		obj("add", kind)
		m.Set.format(sb)
	case unix.NFT_MSG_DELSET:
		obj("delete", "set")
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		verb := "add"
		if m.Type == unix.NFT_MSG_DELSETELEM {
			if len(m.Elems) == 0 {
				obj("flush", "set")
				return
			}
			verb = "delete"
		}
		obj(verb, "element")
		s := sets(m.Name)
		els := slices.Clone(m.Elems)
		slices.SortStableFunc(els, func(a, b Elem) int {
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
		})
		if len(els) == 1 {
			sb.WriteString(" { ")
			formatElem(sb, &els[0], s)
			sb.WriteString(" }")
			return
		}
		sb.WriteString(" {")
		for i := range els {
			sb.WriteString("\n\t")
			formatElem(sb, &els[i], s)
		}
		sb.WriteString("\n}")
	default:
		fmt.Fprintf(sb, "nf_tables message %d %s %s %s", m.Type, protoName(m.Proto), m.Table, m.Name)
	}
}

func (s *Set) format(sb *strings.Builder) {
	sb.WriteString(" { type " + s.Key.String())
	if s.Data != 0 {
		sb.WriteString(" : " + s.Data.String())
	}
	sb.WriteString(";")
	var flags []string
	if s.Interval {
		flags = append(flags, "interval")
	}
	if s.Timeout {
		flags = append(flags, "timeout")
	}
	if s.Dynamic {
		flags = append(flags, "dynamic")
	}
	if len(flags) > 0 {
		sb.WriteString(" flags " + strings.Join(flags, ",") + ";")
	}
	if s.Size > 0 {
		fmt.Fprintf(sb, " size %d;", s.Size)
	}
	if s.Comment != "" {
		sb.WriteString(" comment " + strconv.Quote(s.Comment) + ";")
	}
	sb.WriteString(" }")
}

func hookName(n uint32) string {
	switch n {
	case unix.NF_INET_PRE_ROUTING:
		return "prerouting"
	case unix.NF_INET_LOCAL_IN:
		return "input"
	case unix.NF_INET_FORWARD:
		return "forward"
	case unix.NF_INET_LOCAL_OUT:
		return "output"
	case unix.NF_INET_POST_ROUTING:
		return "postrouting"
	}
	return "hook" + itoa(uint64(n))
}

// formatElem writes one element: key (or range), timeout, data.
func formatElem(sb *strings.Builder, e *Elem, s *Set) {
	var key, data Datatype
	if s != nil {
		key, data = s.Key, s.Data
	}
	formatValue(sb, e.Key, key)
	if e.KeyEnd != nil {
		sb.WriteString(" - ")
		formatValue(sb, e.KeyEnd, key)
	}
	if e.IntervalEnd {
		sb.WriteString(" (interval end)")
	}
	if e.Timeout != 0 {
		sb.WriteString(" timeout " + e.Timeout.String())
	}
	switch {
	case e.Verdict != nil:
		sb.WriteString(" : " + verdictText(e.Verdict))
	case e.Val != nil:
		sb.WriteString(" : ")
		formatValue(sb, e.Val, data)
	}
}

// formatValue writes a key or data value of type t field by field, or in
// hex when t does not describe it.
func formatValue(sb *strings.Builder, v []byte, t Datatype) {
	fields := t.Fields()
	sizes := make([]int, len(fields))
	total := 0
	for i, f := range fields {
		sizes[i] = int(f.size())
		if sizes[i] == 0 {
			total = -1
			break
		}
		if len(fields) > 1 {
			total += align4(sizes[i])
		} else {
			total += sizes[i]
		}
	}
	if len(fields) == 0 || total != len(v) {
		sb.WriteString("0x" + hexString(v))
		return
	}
	for i, f := range fields {
		if i > 0 {
			sb.WriteString(" . ")
		}
		formatField(sb, v[:sizes[i]], f)
		if len(fields) > 1 {
			v = v[align4(sizes[i]):]
		}
	}
}

func formatField(sb *strings.Builder, v []byte, t Datatype) {
	switch t {
	case TypeIPAddr, TypeIP6Addr:
		a, _ := netip.AddrFromSlice(v)
		sb.WriteString(a.String())
	case TypeInetProto:
		sb.WriteString(protoText(v[0]))
	case TypeInetService:
		sb.WriteString(itoa(uint64(binary.BigEndian.Uint16(v))))
	case TypeMark:
		fmt.Fprintf(sb, "0x%08x", binary.NativeEndian.Uint32(v))
	default:
		sb.WriteString("0x" + hexString(v))
	}
}

func protoText(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return itoa(uint64(p))
}

func hexString(v []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(v))
	for _, b := range v {
		out = append(out, digits[b>>4], digits[b&15])
	}
	return string(out)
}

func verdictText(v *Verdict) string {
	switch v.Code {
	case nfDrop:
		return "drop"
	case nfAccept:
		return "accept"
	case unix.NFT_GOTO:
		return "goto " + v.Chain
	case unix.NFT_JUMP:
		return "jump " + v.Chain
	case unix.NFT_RETURN:
		return "return"
	case unix.NFT_CONTINUE:
		return "continue"
	case unix.NFT_BREAK:
		return "break"
	}
	return "verdict " + strconv.Itoa(int(v.Code))
}
