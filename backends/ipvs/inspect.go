package ipvs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	mipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file reads back from the kernel what the backend programmed, as
// [proxier.Frontend]s: the IPVS virtual servers it owns with the real
// servers new connections go to, and what its nftables table does to
// them before IPVS (drop, reject, load-balancer source ranges).
//
// What IPVS does with externalTrafficPolicy Local is reported as it is:
// one virtual server per address and port holds the local endpoints for
// every source, so a frontend has no SomeSources (kube-proxy's ipvs mode
// does the same; docs/KUBE-PROXY-DIFFERENCES.md).

var _ proxier.Inspector = (*backend)(nil)

// Inspect implements [proxier.Inspector]: it reads the backend's virtual
// servers and its table back from the kernel and returns their
// frontends.
func (b *backend) Inspect(ctx context.Context) ([]proxier.Frontend, error) {
	if b.nl == nil {
		return nil, errors.New("ipvs: backend is closed")
	}
	tr, ok := b.nft.c.(tableReader)
	if !ok {
		return nil, errors.New("ipvs: the nftables connection cannot read tables back")
	}
	r := &reader{fi: b.fi, links: b.links, ipvs: b.ipvs.h, nft: tr}
	return r.read(ctx)
}

// Inspect reads what a proxier configured by cfg programmed in family,
// from the kernel and without a proxier: the frontends of the virtual
// servers owned by the table cfg.TableName or on the addresses of the
// interface cfg.InterfaceName (defaults when unset) in cfg.NetNS. It is
// read in several requests, not atomically: a proxier syncing meanwhile
// may show half a change. A kernel without IPVS, or a namespace without
// the table, holds no virtual server; it may still hold the table's
// verdicts.
func Inspect(ctx context.Context, cfg Config, family model.IPFamily) ([]proxier.Frontend, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("ipvs: unknown IP family %v", family)
	}
	cfg = cfg.WithDefaults()
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	defer ns.Close()
	nl, err := ns.NetlinkHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("ipvs: netlink handle: %w", err)
	}
	defer nl.Close()
	r := &reader{fi: newFamily(family, cfg.TableName), links: &links{h: nl, name: cfg.InterfaceName}}
	if _, err := nl.GenlFamilyGet("IPVS"); err == nil {
		// moby/ipvs opens its socket in the calling thread's namespace.
		if err := ns.Do(func() error {
			var err error
			r.ipvs, err = mipvs.New("")
			return err
		}); err != nil {
			return nil, fmt.Errorf("ipvs: open IPVS netlink socket: %w", err)
		}
		defer r.ipvs.Close()
	}
	c, err := nftnl.Dial(ns)
	if err != nil {
		return nil, fmt.Errorf("ipvs: nftables: %w", err)
	}
	defer c.Close()
	r.nft = c
	return r.read(ctx)
}

// tableReader reads a whole nftables table back ([nftnl.NetlinkConn]).
type tableReader interface {
	ReadTable(ctx context.Context, proto byte, table string) (*nftnl.Table, error)
}

// reader reads one family's frontends from a namespace.
type reader struct {
	fi    family
	links *links
	ipvs  *mipvs.Handle // nil: the kernel has no IPVS
	nft   tableReader
}

// read reads the table, the dummy interface's addresses and the virtual
// servers with their real servers, and converts them.
func (r *reader) read(ctx context.Context) ([]proxier.Frontend, error) {
	nt, err := r.nft.ReadTable(ctx, r.fi.table.proto, r.fi.table.name)
	if errors.Is(err, fs.ErrNotExist) {
		nt = nil
	} else if err != nil {
		return nil, fmt.Errorf("ipvs: read table %s: %w", r.fi.table.name, err)
	}
	bound, err := r.boundAddrs()
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	var svcs []*mipvs.Service
	if r.ipvs != nil {
		if svcs, err = dumpServices(r.ipvs); err != nil {
			return nil, fmt.Errorf("ipvs: %w", err)
		}
	}
	dests := func(s *mipvs.Service) ([]*mipvs.Destination, error) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("ipvs: list real servers: %w", err)
		}
		ds, err := r.ipvs.GetDestinations(s)
		if err != nil {
			return nil, fmt.Errorf("ipvs: list real servers of %s:%d: %w", s.Address, s.Port, err)
		}
		return ds, nil
	}
	return frontends(decodeTable(&r.fi, nt), bound, svcs, dests)
}

// boundAddrs returns the addresses of the family on the dummy interface.
func (r *reader) boundAddrs() (map[netip.Addr]bool, error) {
	link, err := r.links.find()
	if err != nil || link == nil {
		return nil, err
	}
	addrs, err := r.links.addrs(link, r.fi.fam)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		out[a] = true
	}
	return out, nil
}

// frontends converts what was read: the virtual servers the backend owns
// (recorded in the table's virtual set, or on an address of the dummy
// interface), each with the real servers dests reads, then the keys the
// table drops or rejects that have no virtual server.
func frontends(tv *tableView, bound map[netip.Addr]bool, svcs []*mipvs.Service,
	dests func(*mipvs.Service) ([]*mipvs.Destination, error)) ([]proxier.Frontend, error) {
	var out []proxier.Frontend
	seen := map[vsKey]bool{}
	for _, s := range svcs {
		k, ok := serviceKey(s, tv.fam)
		if !ok || seen[k] || !(tv.virtual[k] || bound[k.Addr]) {
			continue
		}
		seen[k] = true
		ds, err := dests(s)
		if err != nil {
			return nil, err
		}
		out = append(out, tv.frontend(k, s, ds))
	}
	for _, k := range tv.verdictKeys() {
		if !seen[k] && tv.verdict(k) != "" {
			out = append(out, tv.frontend(k, nil, nil))
		}
	}
	return out, nil
}

// serviceKey returns the key of an address-based virtual server of
// family fam (a firewall-mark service has none, nor does a protocol
// the backend does not program).
func serviceKey(s *mipvs.Service, fam model.IPFamily) (vsKey, bool) {
	afi := uint16(familyIPv4)
	if fam == model.IPv6 {
		afi = familyIPv6
	}
	if s.FWMark != 0 || s.AddressFamily != afi {
		return vsKey{}, false
	}
	a, ok := netip.AddrFromSlice(s.Address)
	p, known := model.ProtocolOfNumber(byte(s.Protocol))
	if !ok || !known {
		return vsKey{}, false
	}
	return vsKey{Addr: a.Unmap(), Proto: p, Port: s.Port}, true
}

// frontend returns the frontend of key k: its virtual server s (nil when
// there is none) with its real servers ds, and what the table does to
// its new connections first.
func (tv *tableView) frontend(k vsKey, s *mipvs.Service, ds []*mipvs.Destination) proxier.Frontend {
	f := proxier.Frontend{Addr: k.Addr, Protocol: k.Proto, Port: k.Port, Verdict: tv.verdict(k)}
	idle := 0
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		if d.Weight <= 0 {
			// Weight 0: draining, no new connection goes there.
			idle++
			continue
		}
		f.Endpoints = append(f.Endpoints, netip.AddrPortFrom(a.Unmap(), d.Port))
	}
	slices.SortFunc(f.Endpoints, netip.AddrPort.Compare)
	f.Endpoints = slices.Compact(f.Endpoints)
	shadowed := 0
	if f.Verdict != "" {
		// The table drops or rejects new connections before IPVS
		// sees them: no real server gets one.
		shadowed, f.Endpoints = len(f.Endpoints), nil
	}
	if s != nil {
		f.Affinity = s.Flags&svcFlagPersistent != 0
	}
	if tv.guarded(k) {
		f.SourceRanges = tv.allowed[k]
		if f.SourceRanges == nil {
			f.SourceRanges = []netip.Prefix{} // admits no source
		}
	}
	f.Detail = tv.detail(k, s, len(f.Endpoints)+shadowed, idle, f.Verdict)
	return f
}

// detail describes where the frontend is held, for people.
func (tv *tableView) detail(k vsKey, s *mipvs.Service, active, idle int, verdict string) string {
	var b strings.Builder
	if s == nil {
		b.WriteString("no virtual server " + k.String())
	} else {
		fmt.Fprintf(&b, "virtual server %s %s", k, s.SchedName)
		if s.Flags&svcFlagPersistent != 0 {
			fmt.Fprintf(&b, " persistent %ds", s.Timeout)
		}
		fmt.Fprintf(&b, ", %d real servers", active)
		if idle > 0 {
			fmt.Fprintf(&b, " (+%d of weight 0)", idle)
		}
	}
	if verdict != "" {
		fmt.Fprintf(&b, "; %s by table %s before IPVS", verdict, tv.table)
	}
	if tv.guarded(k) {
		b.WriteString("; source ranges in set " + setFirewallOK)
	}
	return b.String()
}

// tableView is the backend's table as read back, indexed by virtual
// server key: which sets hold each key, and what the chains do with them.
type tableView struct {
	fam   model.IPFamily
	fi    *family
	table string
	nt    *nftnl.Table // nil when the table does not exist
	// member holds, per key, a bit per set of keySets holding it.
	member map[vsKey]uint
	// serviceAddrs are the elements of the service-addrs set.
	serviceAddrs map[netip.Addr]bool
	virtual      map[vsKey]bool
	// hooked says the input and output chains send new connections
	// through the services chain; firewalled that they send the keys
	// of the firewall set through the firewall chain, which drops what
	// firewall-allow does not admit.
	hooked, firewalled bool
	allowed            map[vsKey][]netip.Prefix
	// verdicts memoizes the verdict of the services chain per
	// membership and protocol (see tableView.verdict).
	verdicts map[membership]string
}

// membership is what the services chain matches a key by: the sets that
// hold it (bits of keySets, and serviceAddrBit) and its protocol.
type membership struct {
	sets  uint
	proto model.Protocol
}

// keySets are the sets keyed by address . protocol . port, whose
// membership decides what the services chain does with a key.
var keySets = []string{setVirtual, setReject, setDrop, setCluster, setMasqExternal, setFirewall}

// setBit is the membership bit of a set of keySets.
func setBit(set string) uint { return 1 << slices.Index(keySets, set) }

// serviceAddrBit is the membership bit of a key whose address is in the
// service-addrs set.
const serviceAddrBit = 1 << 31

// decodeTable indexes a table read back (nil: none).
func decodeTable(fi *family, nt *nftnl.Table) *tableView {
	tv := &tableView{
		fam: fi.fam, fi: fi, table: fi.table.name, nt: nt,
		member: map[vsKey]uint{}, serviceAddrs: map[netip.Addr]bool{}, virtual: map[vsKey]bool{},
		allowed: map[vsKey][]netip.Prefix{}, verdicts: map[membership]string{},
	}
	if nt == nil {
		return tv
	}
	for i, name := range keySets {
		for _, e := range nt.Elems[name] {
			if k, ok := fi.decodeKey(e.Key); ok {
				tv.member[k] |= 1 << i
			}
		}
	}
	for k, m := range tv.member {
		if m&setBit(setVirtual) != 0 {
			tv.virtual[k] = true
		}
	}
	for _, e := range nt.Elems[setServiceAddrs] {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			tv.serviceAddrs[a.Unmap()] = true
		}
	}
	tv.hooked = tv.jumps(chainInput, unix.NF_INET_LOCAL_IN, chainServices, "") &&
		tv.jumps(chainOutput, unix.NF_INET_LOCAL_OUT, chainServices, "")
	tv.firewalled = tv.jumps(chainInput, unix.NF_INET_LOCAL_IN, chainFirewall, setFirewall) &&
		tv.jumps(chainOutput, unix.NF_INET_LOCAL_OUT, chainFirewall, setFirewall) && tv.firewallDrops()
	tv.decodeAllowed()
	return tv
}

// jumps reports whether the base chain name, on hook, has a rule that
// jumps (or goes) to target, looking up the set gate on the way when
// gate is not empty.
func (tv *tableView) jumps(name string, hook uint32, target, gate string) bool {
	c := tv.nt.Chain(name)
	if c == nil || c.Hook == nil || c.Hook.Num != hook {
		return false
	}
	for _, raw := range c.Rules {
		r, err := nftnl.DecodeExprs(tv.nt.Proto, raw)
		if err != nil {
			continue
		}
		gated, jumps := gate == "", false
		for _, e := range r {
			switch e := e.(type) {
			case *expr.Lookup:
				gated = gated || (e.SetName == gate && !e.Invert)
			case *expr.Verdict:
				jumps = (e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto) && e.Chain == target
			}
		}
		if gated && jumps {
			return true
		}
	}
	return false
}

// firewallDrops reports whether the firewall chain, followed for a key
// of the firewall set, ends in a drop for some sources (those the allow
// set does not admit).
func (tv *tableView) firewallDrops() bool {
	s := tv.nt.Set(setFirewall)
	els := tv.nt.Elems[setFirewall]
	if s == nil || len(els) == 0 {
		return false
	}
	fl, ok := tv.nt.FlowOf(s, els[0].Key)
	return ok && slices.Contains(tv.nt.Follow(chainFirewall, fl).Verdicts, "drop")
}

// decodeAllowed reads the firewall-allow set: key . source range.
func (tv *tableView) decodeAllowed() {
	n := int(tv.fi.AddrLen)
	split := func(b []byte) (vsKey, netip.Addr, bool) {
		if len(b) != 2*n+8 {
			return vsKey{}, netip.Addr{}, false
		}
		k, ok := tv.fi.decodeKey(b[:n+8])
		a, aok := netip.AddrFromSlice(b[n+8:])
		return k, a.Unmap(), ok && aok
	}
	for _, e := range tv.nt.Elems[setFirewallOK] {
		k, first, ok := split(e.Key)
		last := first
		if ok && e.KeyEnd != nil {
			_, last, ok = split(e.KeyEnd)
		}
		if ok && first.Compare(last) <= 0 {
			tv.allowed[k] = append(tv.allowed[k], nftnl.RangePrefixes(first, last)...)
		}
	}
}

// guarded reports whether the firewall chain filters the sources of k.
func (tv *tableView) guarded(k vsKey) bool {
	return tv.firewalled && tv.member[k]&setBit(setFirewall) != 0
}

// verdict returns what the services chain does with new connections to
// k, "drop", "reject" or "" (they go on to IPVS). The chain's rules
// match keys by set membership only, so keys of one protocol held by the
// same sets meet the same verdict: the chain is followed (nftnl's
// evaluator) once per membership.
func (tv *tableView) verdict(k vsKey) string {
	if !tv.hooked {
		return ""
	}
	m := membership{sets: tv.member[k], proto: k.Proto}
	if tv.serviceAddrs[k.Addr] {
		m.sets |= serviceAddrBit
	}
	if v, ok := tv.verdicts[m]; ok {
		return v
	}
	fl := nftnl.Flow{Daddr: tv.fi.Addr(k.Addr), Proto: k.Proto.Number(), Dport: k.Port}
	var v string
	if vs := tv.nt.Follow(chainServices, fl).Verdicts; len(vs) > 0 {
		v = vs[0]
	}
	tv.verdicts[m] = v
	return v
}

// verdictKeys returns the keys of the drop and reject sets, sorted.
func (tv *tableView) verdictKeys() []vsKey {
	mask := setBit(setDrop) | setBit(setReject)
	var out []vsKey
	for k, m := range tv.member {
		if m&mask != 0 {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, compareKeys)
	return out
}
