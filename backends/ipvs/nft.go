package ipvs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// This file writes the backend's filter and NAT helper table through
// internal/nftnl: one batch per transaction, sets and elements encoded
// there, rules built from its shared builders.

// Chain names.
const (
	chainInput       = "input"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
	chainServices    = "services"
	chainFirewall    = "firewall"
	chainMarkCluster = "mark-cluster"
)

// Chain priorities: before IPVS, which schedules in LOCAL_IN at
// NF_IP_PRI_NAT_SRC-1 (99) and in LOCAL_OUT at NF_IP_PRI_NAT_DST+2 (-98).
const (
	prioFilter = -110
	prioSNAT   = 100
)

// tableRef names one table: its family and name.
type tableRef struct {
	proto byte
	name  string
}

// family is what differs between the ip and ip6 tables: internal/nftnl's
// family facts, the backend's IP family and its table.
type family struct {
	nftnl.Family
	fam   model.IPFamily
	table tableRef
}

func newFamily(f model.IPFamily, table string) family {
	nf := nftnl.FamilyOf(f)
	return family{Family: nf, fam: f, table: tableRef{proto: nf.Proto, name: table}}
}

// set returns the definition of one of the backend's sets.
func (f *family) set(name string) *nftnl.Set {
	s := &nftnl.Set{Name: name, ID: uint32(slices.Index(setNames, name) + 1)}
	switch name {
	case setProtocols:
		s.Key = nftnl.TypeInetProto
	case setServiceAddrs:
		s.Key = f.AddrType
	case setHairpin:
		s.Key = nftnl.Concat(f.AddrType, f.AddrType)
	case setFirewallOK:
		s.Key = nftnl.Concat(f.AddrType, nftnl.TypeInetProto, nftnl.TypeInetService, f.AddrType)
		s.Interval = true
	default:
		s.Key = nftnl.Concat(f.AddrType, nftnl.TypeInetProto, nftnl.TypeInetService)
	}
	return s
}

// setNames lists the backend's sets.
var setNames = []string{
	setProtocols, setServiceAddrs, setVirtual, setReject, setDrop, setCluster,
	setMasqExternal, setFirewall, setFirewallOK, setHairpin,
}

// keyBytes encodes address . protocol . port, each field padded to 4
// bytes as in a concatenation.
func (f *family) keyBytes(k vsKey) []byte { return f.Key(k.Addr, k.Proto, k.Port) }

// decodeKey is the inverse of keyBytes.
func (f *family) decodeKey(b []byte) (vsKey, bool) {
	n := int(f.AddrLen)
	if len(b) != n+8 {
		return vsKey{}, false
	}
	a, _ := netip.AddrFromSlice(b[:n])
	p, _ := model.ProtocolOfNumber(b[n]) // "" when unknown
	return vsKey{Addr: a.Unmap(), Proto: p, Port: binary.BigEndian.Uint16(b[n+4:])}, true
}

// element encodes e.
func (f *family) element(e elem) nftnl.Elem {
	switch e.Set {
	case setServiceAddrs:
		return nftnl.Elem{Key: f.Addr(e.Addr)}
	case setHairpin:
		return nftnl.Elem{Key: slices.Concat(f.Addr(e.Addr), f.Addr(e.Addr))}
	case setFirewallOK:
		k := f.keyBytes(e.Key)
		return nftnl.Elem{Key: slices.Concat(k, f.Addr(e.Src.Addr())), KeyEnd: slices.Concat(k, f.Addr(nftnl.LastAddr(e.Src)))}
	}
	return nftnl.Elem{Key: f.keyBytes(e.Key)}
}

// keyIn matches packets whose daddr . l4proto . dport is in set.
func (f *family) keyIn(set string) nftnl.Rule {
	k, _ := f.KeyExprs()
	return append(k, nftnl.Lookup(set, nftnl.Reg(0), false))
}

// chainDef is a chain with its rules.
type chainDef struct {
	name  string
	hook  *nftnl.Hook // nil for a regular chain
	rules []nftnl.Rule
}

// skeleton returns the backend's chains and rules; regular chains first,
// so that base chains can jump to them.
func (f *family) skeleton(cfg *Config) []chainDef {
	bit := cfg.MasqueradeBit
	reg := nftnl.Reg
	key, next := f.KeyExprs()
	with := func(parts ...nftnl.Rule) nftnl.Rule { return slices.Concat(parts...) }
	reject := f.Reject()

	// mark-cluster: cluster IP traffic that needs masquerading.
	var markCluster []nftnl.Rule
	switch cidrs := f.clusterCIDRs(cfg); {
	case cfg.MasqueradeAll:
		markCluster = append(markCluster, nftnl.SetMark(bit))
	case len(cidrs) > 0:
		for _, p := range cidrs {
			markCluster = append(markCluster, nftnl.Rule{
				f.LoadSaddr(reg(0)),
				&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: f.AddrLen, Mask: f.mask(p.Bits()), Xor: make([]byte, f.AddrLen)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg(0), Data: f.Addr(p.Masked().Addr())},
				nftnl.Return(),
			})
		}
		markCluster = append(markCluster, nftnl.SetMark(bit))
	}

	services := []nftnl.Rule{
		// Policy Local without local endpoints: drop.
		with(f.keyIn(setDrop), nftnl.Rule{nftnl.Drop()}),
		// No endpoints at all: reject.
		with(f.keyIn(setReject), nftnl.Rule{reject}),
		// A service address on a port that is not a service port:
		// reject, so host services listening on 0.0.0.0 are not
		// reachable through service addresses.
		with(nftnl.Rule{
			nftnl.LoadL4Proto(reg(0)),
			nftnl.Lookup(setProtocols, reg(0), false),
			f.LoadDaddr(reg(0)),
			nftnl.Lookup(setServiceAddrs, reg(0), false),
		}, key, nftnl.Rule{nftnl.Lookup(setVirtual, reg(0), true), reject}),
		// External traffic with policy Cluster is masqueraded.
		with(f.keyIn(setMasqExternal), nftnl.SetMark(bit)),
	}
	if len(markCluster) > 0 {
		services = append(services, with(f.keyIn(setCluster), nftnl.Rule{nftnl.Jump(chainMarkCluster)}))
	}

	firewall := []nftnl.Rule{
		with(key, nftnl.Rule{f.LoadSaddr(reg(next)), nftnl.Lookup(setFirewallOK, reg(0), false), nftnl.Return()}),
		{nftnl.Drop()},
	}

	toFirewall := with(nftnl.CtStateNew(), f.keyIn(setFirewall), nftnl.Rule{nftnl.Jump(chainFirewall)})
	toServices := with(nftnl.CtStateNew(), nftnl.Rule{nftnl.Jump(chainServices)})
	var defs []chainDef
	if len(markCluster) > 0 {
		defs = append(defs, chainDef{chainMarkCluster, nil, markCluster})
	}
	defs = append(defs,
		chainDef{chainServices, nil, services},
		chainDef{chainFirewall, nil, firewall},
		chainDef{chainInput, &nftnl.Hook{Num: unix.NF_INET_LOCAL_IN, Priority: prioFilter, Type: "filter"},
			[]nftnl.Rule{toFirewall, toServices}},
		chainDef{chainOutput, &nftnl.Hook{Num: unix.NF_INET_LOCAL_OUT, Priority: prioFilter, Type: "filter"}, []nftnl.Rule{
			// Source ranges hold for the node's own traffic too (as
			// in kube-proxy), checked before IPVS takes it.
			toFirewall,
			toServices,
			// The node's own traffic to a cluster IP leaves from
			// the service address itself: masquerade it.
			with(nftnl.CtStateNew(), f.keyIn(setCluster), nftnl.SetMark(bit)),
		}},
		chainDef{chainPostrouting, &nftnl.Hook{Num: unix.NF_INET_POST_ROUTING, Priority: prioSNAT, Type: "nat"}, []nftnl.Rule{
			nftnl.MasqueradeMarked(bit),
			// Hairpin: an endpoint reaching itself through a service.
			{f.LoadSaddr(reg(0)), f.LoadDaddr(reg(f.AddrRegs())), nftnl.Lookup(setHairpin, reg(0), false), nftnl.Masquerade()},
		}},
	)
	return defs
}

// mask returns a prefix mask of the family's address length.
func (f *family) mask(bits int) []byte {
	m := make([]byte, f.AddrLen)
	for i := range m {
		switch b := bits - i*8; {
		case b >= 8:
			m[i] = 0xff
		case b > 0:
			m[i] = ^byte(0xff >> b)
		}
	}
	return m
}

func (f *family) clusterCIDRs(cfg *Config) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range cfg.ClusterCIDRs {
		if f.fam.Contains(p.Addr()) {
			out = append(out, p.Masked())
		}
	}
	return out
}

// nftConn is the backend's nf_tables connection: the kernel's in its
// namespace, or a recorder in tests.
type nftConn struct {
	c nftnl.Conn
}

func dialNft(ns *netns.NS) (*nftConn, error) {
	c, err := nftnl.Dial(ns)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &nftConn{c: c}, nil
}

func (n *nftConn) close() error {
	if n == nil || n.c == nil {
		return nil
	}
	err := n.c.Close()
	n.c = nil
	return err
}

// commit commits tx. The backend's operations take no context (nor do
// the IPVS and route netlink calls around them); a commit is one sendto.
func (n *nftConn) commit(tx *nftnl.Batch) error { return n.c.Commit(context.Background(), tx) }

// addElems adds (or, del, deletes) elements to the table's sets, in set
// order; the batch splits large lists over several messages.
func (n *nftConn) addElems(tx *nftnl.Batch, f *family, elems []elem, del bool) {
	bySet := map[string][]nftnl.Elem{}
	for _, e := range elems {
		bySet[e.Set] = append(bySet[e.Set], f.element(e))
	}
	for _, name := range setNames {
		if els := bySet[name]; len(els) > 0 {
			if del {
				tx.DelElems(name, els)
			} else {
				tx.AddElems(name, els)
			}
		}
	}
}

// updateElems adds (or, del, deletes) elements in one transaction.
func (n *nftConn) updateElems(f *family, elems []elem, del bool) error {
	if len(elems) == 0 {
		return nil
	}
	tx := nftnl.NewBatch(f.table.proto, f.table.name)
	n.addElems(tx, f, elems, del)
	return n.commit(tx)
}

// replaceTable makes the family's table hold the skeleton and elems, in
// one transaction. A table that exists is flushed and refilled in place:
// deleting and creating it, even in one transaction, fails new
// connections for a moment. Chains the skeleton does not have (an
// earlier version's) are deleted. Only when the kernel refuses that (an
// earlier version's table with other set definitions) is the table
// deleted and created again, in the transaction that fills it.
func (n *nftConn) replaceTable(f *family, cfg *Config, elems []elem, log *slog.Logger) error {
	existing, exists, err := n.c.Chains(context.Background(), f.table.proto, f.table.name)
	if err != nil {
		return err
	}
	if exists {
		err := n.fillInPlace(f, cfg, elems, existing)
		if err == nil {
			return nil
		}
		log.Warn("kernel refused to refill the table in place; replacing it", "table", f.table.name, "err", err)
	}
	tx := nftnl.NewBatch(f.table.proto, f.table.name)
	tx.AddTable()
	tx.DelTable()
	tx.AddTable()
	if err := n.addSkeleton(tx, f, cfg, false); err != nil {
		return err
	}
	n.addElems(tx, f, elems, false)
	return n.commit(tx)
}

// fillInPlace flushes the existing table's sets and chains and fills
// them again, deleting the chains in existing that the skeleton lacks.
func (n *nftConn) fillInPlace(f *family, cfg *Config, elems []elem, existing []string) error {
	tx := nftnl.NewBatch(f.table.proto, f.table.name)
	tx.AddTable()
	if err := n.addSkeleton(tx, f, cfg, true); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, d := range f.skeleton(cfg) {
		want[d.name] = true
	}
	for _, c := range existing {
		if !want[c] {
			tx.DelChain(c)
		}
	}
	n.addElems(tx, f, elems, false)
	return n.commit(tx)
}

// addSkeleton adds the sets, chains and rules of the table to tx; flush
// first empties the sets and chains that may exist.
func (n *nftConn) addSkeleton(tx *nftnl.Batch, f *family, cfg *Config, flush bool) error {
	for _, name := range setNames {
		tx.AddSet(f.set(name))
		if flush {
			tx.FlushSet(name)
		}
		if name == setProtocols {
			var els []nftnl.Elem
			for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
				els = append(els, nftnl.Elem{Key: []byte{p.Number()}})
			}
			tx.AddElems(name, els)
		}
	}
	defs := f.skeleton(cfg)
	for _, d := range defs {
		tx.AddChain(d.name, d.hook)
		if flush {
			tx.FlushChain(d.name)
		}
	}
	for _, d := range defs {
		for _, r := range d.rules {
			enc, err := nftnl.Encode(f.Proto, r)
			if err != nil {
				return fmt.Errorf("chain %s: %w", d.name, err)
			}
			tx.AddRule(d.name, enc)
		}
	}
	return nil
}

// deleteTable deletes a table whether or not it exists.
func (n *nftConn) deleteTable(t tableRef) error {
	tx := nftnl.NewBatch(t.proto, t.name)
	tx.AddTable()
	tx.DelTable()
	return n.commit(tx)
}

// virtualServers reads the virtual servers recorded in the family's
// table; none when there is no table (or no such set in it).
func (n *nftConn) virtualServers(f *family) ([]vsKey, error) {
	ctx := context.Background()
	exists, err := n.c.TableExists(ctx, f.table.proto, f.table.name)
	if err != nil || !exists {
		return nil, err
	}
	els, err := n.c.SetElements(ctx, f.table.proto, f.table.name, setVirtual)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []vsKey
	for _, e := range els {
		if k, ok := f.decodeKey(e.Key); ok {
			out = append(out, k)
		}
	}
	return out, nil
}

// probe checks that the kernel takes the backend's table, in a
// transaction that creates a scratch table and deletes it.
func (n *nftConn) probe(f family, cfg *Config) error {
	f.table.name = fmt.Sprintf("%s-probe-%d", f.table.name, os.Getpid())
	tx := nftnl.NewBatch(f.table.proto, f.table.name)
	tx.AddTable()
	if err := n.addSkeleton(tx, &f, cfg, false); err != nil {
		return err
	}
	tx.DelTable()
	return n.commit(tx)
}
