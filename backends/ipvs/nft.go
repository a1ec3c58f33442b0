package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

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

// maxElemsPerMsg bounds the elements in one netlink message.
const maxElemsPerMsg = 1024

// family is what differs between the ip and ip6 tables.
type family struct {
	fam         model.IPFamily
	table       *nftables.Table
	addrType    nftables.SetDatatype
	addrLen     uint32 // bytes
	saddrOff    uint32 // offset of the source address in the network header
	daddrOff    uint32
	portUnreach uint8
}

func newFamily(f model.IPFamily, table string) family {
	if f == model.IPv6 {
		return family{
			fam:         f,
			table:       &nftables.Table{Name: table, Family: nftables.TableFamilyIPv6},
			addrType:    nftables.TypeIP6Addr,
			addrLen:     16,
			saddrOff:    8,
			daddrOff:    24,
			portUnreach: 4, // ICMPV6_PORT_UNREACH
		}
	}
	return family{
		fam:         f,
		table:       &nftables.Table{Name: table, Family: nftables.TableFamilyIPv4},
		addrType:    nftables.TypeIPAddr,
		addrLen:     4,
		saddrOff:    12,
		daddrOff:    16,
		portUnreach: 3, // ICMP_PORT_UNREACH
	}
}

// set returns the definition of one of the backend's sets.
func (f *family) set(name string) *nftables.Set {
	s := &nftables.Set{Table: f.table, Name: name}
	switch name {
	case setProtocols:
		s.KeyType = nftables.TypeInetProto
	case setServiceAddrs:
		s.KeyType = f.addrType
	case setHairpin:
		s.KeyType = nftables.MustConcatSetType(f.addrType, f.addrType)
		s.Concatenation = true
	case setFirewallOK:
		s.KeyType = nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService, f.addrType)
		s.Concatenation, s.Interval = true, true
	default:
		s.KeyType = nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService)
		s.Concatenation = true
	}
	return s
}

// setNames lists the backend's sets.
var setNames = []string{
	setProtocols, setServiceAddrs, setVirtual, setReject, setDrop, setCluster,
	setMasqExternal, setFirewall, setFirewallOK, setHairpin,
}

func (f *family) addr(a netip.Addr) []byte {
	if f.fam == model.IPv6 {
		b := a.As16()
		return b[:]
	}
	b := a.Unmap().As4()
	return b[:]
}

// keyBytes encodes address . protocol . port, each field padded to 4
// bytes as in a concatenation.
func (f *family) keyBytes(k vsKey) []byte {
	b := f.addr(k.Addr)
	b = append(b, k.Proto.Number(), 0, 0, 0)
	return append(b, byte(k.Port>>8), byte(k.Port), 0, 0)
}

// decodeKey is the inverse of keyBytes.
func (f *family) decodeKey(b []byte) (vsKey, bool) {
	n := int(f.addrLen)
	if len(b) != n+8 {
		return vsKey{}, false
	}
	a, _ := netip.AddrFromSlice(b[:n])
	p, _ := model.ProtocolOfNumber(b[n]) // "" when unknown
	return vsKey{Addr: a.Unmap(), Proto: p, Port: binary.BigEndian.Uint16(b[n+4:])}, true
}

// element encodes e.
func (f *family) element(e elem) nftables.SetElement {
	switch e.Set {
	case setServiceAddrs:
		return nftables.SetElement{Key: f.addr(e.Addr)}
	case setHairpin:
		return nftables.SetElement{Key: slices.Concat(f.addr(e.Addr), f.addr(e.Addr))}
	case setFirewallOK:
		k := f.keyBytes(e.Key)
		return nftables.SetElement{Key: slices.Concat(k, f.addr(e.Src.Addr())), KeyEnd: slices.Concat(k, f.addr(lastAddr(e.Src)))}
	}
	return nftables.SetElement{Key: f.keyBytes(e.Key)}
}

// lastAddr returns the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := range b {
		bits := p.Bits() - i*8
		switch {
		case bits >= 8:
		case bits <= 0:
			b[i] = 0xff
		default:
			b[i] |= 0xff >> bits
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Registers: 32-bit registers NFT_REG32_00 (8) upward.
func reg(i uint32) uint32 { return 8 + i }

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// loadKey loads daddr . l4proto . th dport from register 0 and returns
// the next free register.
func (f *family) loadKey() ([]expr.Any, uint32) {
	n := f.addrLen / 4
	return []expr.Any{
		&expr.Payload{DestRegister: reg(0), Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg(n)},
		&expr.Payload{DestRegister: reg(n + 1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, n + 2
}

func lookup(set string, r uint32, invert bool) expr.Any {
	return &expr.Lookup{SourceRegister: r, SetName: set, Invert: invert}
}

func (f *family) keyIn(set string) []expr.Any {
	k, _ := f.loadKey()
	return append(k, lookup(set, reg(0), false))
}

func ctStateNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg(0), Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: u32(expr.CtStateBitNEW), Xor: u32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: u32(0)},
	}
}

func setMark(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg(0)},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: u32(^bit), Xor: u32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)},
	}
}

func verdict(k expr.VerdictKind, chain string) expr.Any {
	return &expr.Verdict{Kind: k, Chain: chain}
}

// chainDef is a chain with its rules.
type chainDef struct {
	chain *nftables.Chain
	rules [][]expr.Any
}

// skeleton returns the backend's chains and rules; regular chains first,
// so that base chains can jump to them.
func (f *family) skeleton(cfg *Config) []chainDef {
	bit := cfg.MasqueradeBit
	regular := func(name string) *nftables.Chain { return &nftables.Chain{Table: f.table, Name: name} }
	base := func(name string, hook *nftables.ChainHook, typ nftables.ChainType, prio int32) *nftables.Chain {
		p := nftables.ChainPriority(prio)
		accept := nftables.ChainPolicyAccept
		return &nftables.Chain{Table: f.table, Name: name, Hooknum: hook, Type: typ, Priority: &p, Policy: &accept}
	}
	key, next := f.loadKey()
	with := func(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

	// mark-cluster: cluster IP traffic that needs masquerading.
	var markCluster [][]expr.Any
	switch cidrs := f.clusterCIDRs(cfg); {
	case cfg.MasqueradeAll:
		markCluster = append(markCluster, setMark(bit))
	case len(cidrs) > 0:
		for _, p := range cidrs {
			markCluster = append(markCluster, []expr.Any{
				&expr.Payload{DestRegister: reg(0), Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
				&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: f.addrLen, Mask: f.mask(p.Bits()), Xor: make([]byte, f.addrLen)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg(0), Data: f.addr(p.Masked().Addr())},
				verdict(expr.VerdictReturn, ""),
			})
		}
		markCluster = append(markCluster, setMark(bit))
	}

	services := [][]expr.Any{
		// Policy Local without local endpoints: drop.
		with(f.keyIn(setDrop), []expr.Any{verdict(expr.VerdictDrop, "")}),
		// No endpoints at all: reject.
		with(f.keyIn(setReject), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.portUnreach}}),
		// A service address on a port that is not a service port:
		// reject, so host services listening on 0.0.0.0 are not
		// reachable through service addresses.
		with([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg(0)},
			lookup(setProtocols, reg(0), false),
			&expr.Payload{DestRegister: reg(0), Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
			lookup(setServiceAddrs, reg(0), false),
		}, key, []expr.Any{lookup(setVirtual, reg(0), true),
			&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.portUnreach}}),
		// External traffic with policy Cluster is masqueraded.
		with(f.keyIn(setMasqExternal), setMark(bit)),
	}
	if len(markCluster) > 0 {
		services = append(services, with(f.keyIn(setCluster), []expr.Any{verdict(expr.VerdictJump, chainMarkCluster)}))
	}

	firewall := [][]expr.Any{
		with(key, []expr.Any{
			&expr.Payload{DestRegister: reg(next), Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
			lookup(setFirewallOK, reg(0), false),
			verdict(expr.VerdictReturn, ""),
		}),
		{verdict(expr.VerdictDrop, "")},
	}

	var defs []chainDef
	if len(markCluster) > 0 {
		defs = append(defs, chainDef{regular(chainMarkCluster), markCluster})
	}
	defs = append(defs,
		chainDef{regular(chainServices), services},
		chainDef{regular(chainFirewall), firewall},
		chainDef{base(chainInput, nftables.ChainHookInput, nftables.ChainTypeFilter, prioFilter), [][]expr.Any{
			with(ctStateNew(), f.keyIn(setFirewall), []expr.Any{verdict(expr.VerdictJump, chainFirewall)}),
			with(ctStateNew(), []expr.Any{verdict(expr.VerdictJump, chainServices)}),
		}},
		chainDef{base(chainOutput, nftables.ChainHookOutput, nftables.ChainTypeFilter, prioFilter), [][]expr.Any{
			// Source ranges hold for the node's own traffic too (as
			// in kube-proxy), checked before IPVS takes it.
			with(ctStateNew(), f.keyIn(setFirewall), []expr.Any{verdict(expr.VerdictJump, chainFirewall)}),
			with(ctStateNew(), []expr.Any{verdict(expr.VerdictJump, chainServices)}),
			// The node's own traffic to a cluster IP leaves from
			// the service address itself: masquerade it.
			with(ctStateNew(), f.keyIn(setCluster), setMark(bit)),
		}},
		chainDef{base(chainPostrouting, nftables.ChainHookPostrouting, nftables.ChainTypeNAT, prioSNAT), [][]expr.Any{
			{
				&expr.Meta{Key: expr.MetaKeyMARK, Register: reg(0)},
				&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(1), Len: 4, Mask: u32(bit), Xor: u32(0)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(1), Data: u32(0)},
				&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: u32(^bit), Xor: u32(0)},
				&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)},
				&expr.Masq{FullyRandom: true},
			},
			// Hairpin: an endpoint reaching itself through a service.
			{
				&expr.Payload{DestRegister: reg(0), Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
				&expr.Payload{DestRegister: reg(f.addrLen / 4), Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOff, Len: f.addrLen},
				lookup(setHairpin, reg(0), false),
				&expr.Masq{FullyRandom: true},
			},
		}},
	)
	return defs
}

// mask returns a prefix mask of the family's address length.
func (f *family) mask(bits int) []byte {
	m := make([]byte, f.addrLen)
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

// nftConn is the backend's nftables connection in its namespace.
type nftConn struct {
	c *nftables.Conn
}

func dialNft(ns *netns.NS) (*nftConn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigBuffers)}
	if !ns.Own() {
		opts = append(opts, nftables.WithNetNSFd(ns.Fd()))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &nftConn{c: c}, nil
}

// bigBuffers lets a full sync of many services go in one batch.
func bigBuffers(c *mnl.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, o := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o, 64<<20); e != nil && !errors.Is(e, unix.EPERM) {
				serr = e
			}
		}
	})
	return errors.Join(err, serr)
}

func (n *nftConn) close() error {
	if n == nil || n.c == nil {
		return nil
	}
	err := n.c.CloseLasting()
	n.c = nil
	return err
}

// addElems queues the addition (or deletion) of elements, in messages of
// at most maxElemsPerMsg elements.
func (n *nftConn) queueElems(f *family, elems []elem, del bool) error {
	bySet := map[string][]nftables.SetElement{}
	for _, e := range elems {
		bySet[e.Set] = append(bySet[e.Set], f.element(e))
	}
	for _, name := range setNames {
		els := bySet[name]
		s := f.set(name)
		for len(els) > 0 {
			chunk := els[:min(len(els), maxElemsPerMsg)]
			els = els[len(chunk):]
			var err error
			if del {
				err = n.c.SetDeleteElements(s, chunk)
			} else {
				err = n.c.SetAddElements(s, chunk)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// replaceTable makes the family's table hold the skeleton and elems, in
// one transaction. A table that exists is flushed and refilled in place:
// deleting and creating it, even in one transaction, fails new
// connections for a moment. Chains the skeleton does not have (an
// earlier version's) are deleted. Only when the kernel refuses that (an
// earlier version's table with other set definitions) is the table
// deleted and created again, in the transaction that fills it.
func (n *nftConn) replaceTable(f *family, cfg *Config, elems []elem, log *slog.Logger) error {
	chains, err := n.c.ListChainsOfTableFamily(f.table.Family)
	if err != nil {
		return err
	}
	var existing []string
	exists := false
	for _, c := range chains {
		if c.Table.Name == f.table.Name {
			existing = append(existing, c.Name)
			exists = true
		}
	}
	if !exists {
		tables, err := n.c.ListTablesOfFamily(f.table.Family)
		if err != nil {
			return err
		}
		exists = slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.table.Name })
	}
	if exists {
		err := n.fillInPlace(f, cfg, elems, existing)
		if err == nil {
			return nil
		}
		log.Warn("kernel refused to refill the table in place; replacing it", "table", f.table.Name, "err", err)
	}
	n.c.AddTable(f.table)
	n.c.DelTable(f.table)
	n.c.AddTable(f.table)
	if err := n.addSkeleton(f, cfg, false); err != nil {
		return err
	}
	if err := n.queueElems(f, elems, false); err != nil {
		return err
	}
	return n.c.Flush()
}

// fillInPlace flushes the existing table's sets and chains and fills
// them again, deleting the chains in existing that the skeleton lacks.
func (n *nftConn) fillInPlace(f *family, cfg *Config, elems []elem, existing []string) error {
	n.c.AddTable(f.table)
	if err := n.addSkeleton(f, cfg, true); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, d := range f.skeleton(cfg) {
		want[d.chain.Name] = true
	}
	for _, c := range existing {
		if !want[c] {
			n.c.DelChain(&nftables.Chain{Table: f.table, Name: c})
		}
	}
	if err := n.queueElems(f, elems, false); err != nil {
		return err
	}
	return n.c.Flush()
}

// addSkeleton queues the sets, chains and rules of the table; flush
// first empties the sets and chains that may exist.
func (n *nftConn) addSkeleton(f *family, cfg *Config, flush bool) error {
	for _, name := range setNames {
		s := f.set(name)
		var els []nftables.SetElement
		if name == setProtocols {
			for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
				els = append(els, nftables.SetElement{Key: []byte{p.Number()}})
			}
		}
		if !flush {
			if err := n.c.AddSet(s, els); err != nil {
				return err
			}
			continue
		}
		if err := n.c.AddSet(s, nil); err != nil {
			return err
		}
		n.c.FlushSet(s)
		if len(els) > 0 {
			if err := n.c.SetAddElements(s, els); err != nil {
				return err
			}
		}
	}
	defs := f.skeleton(cfg)
	for _, d := range defs {
		n.c.AddChain(d.chain)
		if flush {
			n.c.FlushChain(d.chain)
		}
	}
	for _, d := range defs {
		for _, r := range d.rules {
			n.c.AddRule(&nftables.Rule{Table: f.table, Chain: d.chain, Exprs: r})
		}
	}
	return nil
}

// deleteTable deletes the family's table whether or not it exists.
func (n *nftConn) deleteTable(t *nftables.Table) error {
	n.c.AddTable(t)
	n.c.DelTable(t)
	return n.c.Flush()
}

// virtualServers reads the virtual servers recorded in the family's
// table; none when there is no table.
func (n *nftConn) virtualServers(f *family) ([]vsKey, error) {
	tables, err := n.c.ListTablesOfFamily(f.table.Family)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == f.table.Name }) {
		return nil, nil
	}
	els, err := n.c.GetSetElements(f.set(setVirtual))
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
	f.table = &nftables.Table{Name: fmt.Sprintf("%s-probe-%d", f.table.Name, os.Getpid()), Family: f.table.Family}
	n.c.AddTable(f.table)
	if err := n.addSkeleton(&f, cfg, false); err != nil {
		return err
	}
	n.c.DelTable(f.table)
	return n.c.Flush()
}
