package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// Formatting of nftables objects read over netlink.

// wrap joins items with ", ", breaking lines before width and indenting
// continuation lines by indent.
func wrap(items []string, indent, width int) string {
	var b strings.Builder
	col := indent
	for i, it := range items {
		if i > 0 {
			b.WriteString(",")
			col++
			if col+1+len(it) > width {
				b.WriteString("\n" + strings.Repeat(" ", indent))
				col = indent
			} else {
				b.WriteString(" ")
				col++
			}
		}
		b.WriteString(it)
		col += len(it)
	}
	return b.String()
}

func hookName(h gnft.ChainHook) string {
	switch h {
	case *gnft.ChainHookPrerouting:
		return "prerouting"
	case *gnft.ChainHookInput:
		return "input"
	case *gnft.ChainHookForward:
		return "forward"
	case *gnft.ChainHookOutput:
		return "output"
	case *gnft.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook %d", h)
}

// formatElems formats a set's elements, one per line (several per line
// for plain address sets).
func formatElems(s *gnft.Set, keyTypes []gnft.SetDatatype, elems []gnft.SetElement) []string {
	if s.Interval {
		return []string{formatIntervals(elems)}
	}
	var out []string
	for _, e := range elems {
		k := formatValue(keyTypes, e.Key)
		switch v := elemVerdict(s, e); {
		case v != nil:
			k += " → " + formatVerdict(v)
		case s.IsMap:
			dt := []gnft.SetDatatype{s.DataType}
			if strings.Contains(s.DataType.Name, " . ") {
				dt = gnft.ConcatSetTypeElements(s.DataType)
			}
			k += " → " + formatValue(dt, e.Val)
		}
		out = append(out, k)
	}
	slices.Sort(out)
	if !s.IsMap {
		return strings.Split(wrap(out, 0, 76), "\n")
	}
	return out
}

// formatIntervals formats the elements of an interval set of addresses
// as prefixes or ranges.
func formatIntervals(elems []gnft.SetElement) string {
	type bound struct {
		a   netip.Addr
		end bool
	}
	var bs []bound
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			continue
		}
		bs = append(bs, bound{a, e.IntervalEnd})
	}
	slices.SortFunc(bs, func(x, y bound) int { return x.a.Compare(y.a) })
	var out []string
	for i := 0; i < len(bs); i++ {
		if bs[i].end {
			continue
		}
		start := bs[i].a
		if i+1 < len(bs) && bs[i+1].end {
			out = append(out, rangeString(start, bs[i+1].a))
			i++
		} else {
			out = append(out, start.String()+"-end")
		}
	}
	return strings.Join(out, ", ")
}

// rangeString returns [start, end) as a prefix when it is one.
func rangeString(start, end netip.Addr) string {
	for bits := start.BitLen(); bits >= 0; bits-- {
		p := netip.PrefixFrom(start, bits)
		if p.Masked().Addr() != start {
			break
		}
		last := lastAddr(p)
		if last.Next() == end {
			return p.String()
		}
	}
	return start.String() + "-" + end.String()
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// formatValue formats a (concatenated) value of the given types; each
// component takes a multiple of 4 bytes.
func formatValue(types []gnft.SetDatatype, b []byte) string {
	var parts []string
	for _, t := range types {
		n := int(t.Bytes)
		if n == 0 || len(b) < n {
			parts = append(parts, fmt.Sprintf("%x", b))
			break
		}
		v := b[:n]
		switch t.Name {
		case "ipv4_addr", "ipv6_addr":
			a, _ := netip.AddrFromSlice(v)
			parts = append(parts, a.String())
		case "inet_proto":
			p, _ := model.ProtocolOfNumber(v[0])
			parts = append(parts, strings.ToLower(string(p)))
		case "inet_service":
			parts = append(parts, fmt.Sprint(binary.BigEndian.Uint16(v)))
		case "mark":
			parts = append(parts, fmt.Sprint(binary.NativeEndian.Uint32(v)))
		default:
			parts = append(parts, fmt.Sprintf("%x", v))
		}
		b = b[min(len(b), (n+3)/4*4):]
	}
	return strings.Join(parts, " . ")
}

// elemVerdict returns the verdict of an element of a verdict map, or nil.
// google/nftables v0.3.0 leaves it undecoded in Val.
func elemVerdict(s *gnft.Set, el gnft.SetElement) *expr.Verdict {
	if el.VerdictData != nil {
		return el.VerdictData
	}
	if !s.IsMap || s.DataType.Name != "" || len(el.Val) == 0 {
		return nil
	}
	return parseVerdict(el.Val)
}

// parseVerdict parses verdict data as the kernel sends it: the nested
// attributes NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN.
func parseVerdict(b []byte) *expr.Verdict {
	v := &expr.Verdict{}
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff
		if n < 4 || n > len(b) {
			break
		}
		data := b[4:n]
		switch {
		case typ == unix.NFTA_VERDICT_CODE && len(data) == 4:
			v.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(data)))
		case typ == unix.NFTA_VERDICT_CHAIN:
			v.Chain = strings.TrimRight(string(data), "\x00")
		}
		b = b[min(len(b), (n+3)/4*4):]
	}
	return v
}

func formatVerdict(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictReturn:
		return "return"
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}
