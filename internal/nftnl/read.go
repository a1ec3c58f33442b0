package nftnl

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file reads a whole table back as values: its chains with their
// rules, its sets with their elements. [Table.Follow] works out from them
// where a packet goes.

// Table is a table as the kernel holds it, read by
// [NetlinkConn.ReadTable].
type Table struct {
	// Proto is the table family (NFPROTO_IPV4, NFPROTO_IPV6, ...).
	Proto byte
	// Name names the table.
	Name string
	// Chains are the table's chains, in the kernel's order (creation).
	Chains []Chain
	// Sets are the table's sets and maps, in the kernel's order.
	Sets []*Set
	// Elems are the elements of each set, by set name, as the kernel
	// lists them.
	Elems map[string][]Elem
}

// Chain is a chain read back, with its rules.
type Chain struct {
	// Name names the chain.
	Name string
	// Hook is a base chain's hook, nil for a regular chain; Policy its
	// policy ([VerdictAccept] or [VerdictDrop]).
	Hook   *Hook
	Policy uint32
	// Rules are the chain's rules, in order, each its encoded
	// expressions (NFTA_RULE_EXPRESSIONS): see [ExprText] and [DecodeExprs].
	Rules [][]byte
}

// ExprText returns encoded rule expressions (NFTA_RULE_EXPRESSIONS) in
// libnftnl's debug form, as [Text] prints rules.
func ExprText(exprs []byte) string {
	var sb strings.Builder
	if err := formatExprs(&sb, exprs); err != nil {
		sb.WriteString(" # " + err.Error())
	}
	return sb.String()
}

// DecodeExprs decodes encoded rule expressions (NFTA_RULE_EXPRESSIONS) with
// google/nftables' expr package, the inverse of [Encode]; proto is the
// table family. Expressions of a kind the backends do not use are left
// out.
func DecodeExprs(proto byte, exprs []byte) (Rule, error) {
	ad, err := netlink.NewAttributeDecoder(exprs)
	if err != nil {
		return nil, err
	}
	var out Rule
	for ad.Next() {
		var name string
		var data []byte
		ad.Nested(func(ed *netlink.AttributeDecoder) error {
			for ed.Next() {
				switch ed.Type() {
				case unix.NFTA_EXPR_NAME:
					name = ed.String()
				case unix.NFTA_EXPR_DATA:
					data = ed.Bytes()
				}
			}
			return nil
		})
		e := newExpr(name)
		if e == nil {
			continue
		}
		if err := expr.Unmarshal(proto, data, e); err != nil {
			return out, fmt.Errorf("decode %s expression: %w", name, err)
		}
		// A verdict is an immediate that writes the verdict register.
		if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
			v := &expr.Verdict{}
			if err := expr.Unmarshal(proto, data, v); err != nil {
				return out, fmt.Errorf("decode verdict: %w", err)
			}
			e = v
		}
		out = append(out, e)
	}
	return out, ad.Err()
}

// newExpr returns an empty expression of a kind, nil for a kind the
// backends do not use.
func newExpr(name string) expr.Any {
	switch name {
	case "payload":
		return &expr.Payload{}
	case "meta":
		return &expr.Meta{}
	case "cmp":
		return &expr.Cmp{}
	case "bitwise":
		return &expr.Bitwise{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "numgen":
		return &expr.Numgen{}
	case "hash":
		return &expr.Hash{}
	case "nat":
		return &expr.NAT{}
	case "masq":
		return &expr.Masq{}
	case "redir":
		return &expr.Redir{}
	case "reject":
		return &expr.Reject{}
	case "ct":
		return &expr.Ct{}
	case "fib":
		return &expr.Fib{}
	case "dynset":
		return &expr.Dynset{}
	case "counter":
		return &expr.Counter{}
	case "range":
		return &expr.Range{}
	case "exthdr":
		return &expr.Exthdr{}
	case "limit":
		return &expr.Limit{}
	case "log":
		return &expr.Log{}
	}
	return nil
}

// ReadTable reads the table: its chains with their rules, its sets with
// their elements. A table that does not exist gives an error matching
// unix.ENOENT.
func (c *NetlinkConn) ReadTable(ctx context.Context, proto byte, table string) (*Table, error) {
	exists, err := c.TableExists(ctx, proto, table)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, fmt.Errorf("table %s %s: %w", protoName(proto), table, unix.ENOENT)
	}
	t := &Table{Proto: proto, Name: table, Elems: map[string][]Elem{}}
	chains, err := c.dump(ctx, unix.NFT_MSG_GETCHAIN, proto, table, "")
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	index := map[string]int{}
	for _, m := range chains {
		index[m.Name] = len(t.Chains)
		t.Chains = append(t.Chains, Chain{Name: m.Name, Hook: m.Hook, Policy: m.Policy})
	}
	rules, err := c.dump(ctx, unix.NFT_MSG_GETRULE, proto, table, "")
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	for _, m := range rules {
		if i, ok := index[m.Name]; ok {
			t.Chains[i].Rules = append(t.Chains[i].Rules, m.Exprs)
		}
	}
	sets, err := c.dump(ctx, unix.NFT_MSG_GETSET, proto, table, "")
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, m := range sets {
		t.Sets = append(t.Sets, m.Set)
		els, err := c.SetElements(ctx, proto, table, m.Name)
		if err != nil {
			return nil, err
		}
		t.Elems[m.Name] = els
	}
	return t, nil
}

// Set returns the table's set or map called name, nil if none.
func (t *Table) Set(name string) *Set {
	for _, s := range t.Sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Chain returns the table's chain called name, nil if none.
func (t *Table) Chain(name string) *Chain {
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	return nil
}

// ValueText formats a key or data value of type t as [Text] prints
// elements, e.g. "10.96.0.10 . tcp . 80"; a value t does not describe
// prints in hex.
func ValueText(v []byte, t Datatype) string {
	var sb strings.Builder
	formatValue(&sb, v, t)
	return sb.String()
}

// String returns the verdict as nft prints it: "accept", "drop",
// "goto <chain>", "jump <chain>", "return"...
func (v Verdict) String() string { return verdictText(&v) }

// HookName names a hook number as nft does: "prerouting", "input",
// "forward", "output", "postrouting".
func HookName(num uint32) string { return hookName(num) }
