package nftables

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// This file reads a table of the backend back from the kernel, decoded,
// for tools that show what a node does (the demo, a debugging command).

// Table is one of the backend's tables as the kernel holds it, read back
// by [ReadTable]: its chains, its sets and maps with their elements, and
// where the dispatch maps send each service's packets.
type Table struct {
	// Family is the table's IP family (table family ip or ip6).
	Family model.IPFamily
	// Name names the table.
	Name string
	// Chains are the table's chains, in the kernel's order (creation).
	Chains []Chain
	// Sets are the table's sets and maps, in the kernel's order.
	Sets []Set
	// Routes are the elements of the dispatch maps (service-ips, then
	// service-nodeports), each followed through the rules to where its
	// packets go; sorted by key within a map.
	Routes []Route
}

// Chain is a chain of a [Table].
type Chain struct {
	// Name names the chain.
	Name string
	// Hook is a base chain's hook as nft names it ("prerouting",
	// "input", "forward", "output", "postrouting"); empty for a regular
	// chain. Priority and Policy ("accept" or "drop") are a base
	// chain's.
	Hook     string
	Priority int32
	Policy   string
	// Rules are the chain's rules in order, each in libnftnl's debug
	// form, e.g. "[ payload load 4b @ network header + 16 => reg 8 ]
	// [ lookup reg 8 set service-ips dreg 0 ]".
	Rules []string
}

// Set is a set or map of a [Table].
type Set struct {
	// Name names the set.
	Name string
	// Type is the key's type as nft prints it, e.g. "ipv4_addr .
	// inet_proto . inet_service".
	Type string
	// DataType is a map's data type ("verdict" for a verdict map), empty
	// for a set.
	DataType string
	// Interval is set for a set of ranges.
	Interval bool
	// Elements are the set's elements, sorted by key.
	Elements []Element
}

// Element is an element of a [Set].
type Element struct {
	// Key is the key as nft prints it, e.g. "10.96.0.10 . tcp . 80". A
	// range of an interval set of addresses prints as a prefix
	// ("10.244.0.0/16") or "first-last"; one of a concatenated interval
	// set as "from - to".
	Key string
	// Data is a map element's data, e.g. "goto cluster-006" or
	// "10.244.1.2 . 8080"; empty in a set.
	Data string
}

// Route is where the packets of one element of a dispatch map go.
type Route struct {
	// Map is the dispatch map: "service-ips" (keys address . protocol .
	// port) or "service-nodeports" (keys protocol . port, to any node
	// address).
	Map string
	// Key is the element's key as nft prints it, Verdict its verdict
	// ("goto svc-...").
	Key     string
	Verdict string
	// Chain is the chain the verdict jumps or goes to, empty for any
	// other verdict; the fields below are what following the packet
	// from it found.
	Chain string
	// Endpoints are the DNAT targets every source may reach.
	Endpoints []netip.AddrPort
	// SomeSources are DNAT targets only some sources reach: the path to
	// them depends on the packet's source (its address, the node's own
	// traffic, marks), as externalTrafficPolicy Local does.
	SomeSources []netip.AddrPort
	// Affinity is set when the service records sessions (ClientIP
	// affinity); Remembered are the clients recorded, with the endpoint
	// each one sticks to.
	Affinity   bool
	Remembered []Pin
	// Verdicts are the other ends found: "drop", "reject".
	Verdicts []string
}

// Pin is a session-affinity record: a client and its endpoint.
type Pin struct {
	Client   netip.Addr
	Endpoint netip.AddrPort
}

// ReadTable reads the backend's table name (empty: [DefaultTableName]) of
// family in the network namespace at path netNS (empty: the caller's)
// from the kernel, without a proxier, and decodes it. It is read in
// several requests, not atomically: a proxier syncing meanwhile may show
// half a change.
//
// A table that does not exist gives an error matching fs.ErrNotExist.
// Routes follow only the expressions the backend writes; a chain whose
// rules cannot be decoded counts as empty.
func ReadTable(ctx context.Context, netNS string, family model.IPFamily, name string) (*Table, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("nftables: unknown IP family %v", family)
	}
	if name == "" {
		name = DefaultTableName
	}
	ns, err := netns.Open(netNS)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer ns.Close()
	c, err := nftnl.Dial(ns)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	nt, err := c.ReadTable(ctx, nftnl.FamilyOf(family).Proto, name)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return tableOf(nt, family), nil
}

// tableOf decodes a table read by nftnl.
func tableOf(nt *nftnl.Table, family model.IPFamily) *Table {
	t := &Table{Family: family, Name: nt.Name}
	for _, c := range nt.Chains {
		ch := Chain{Name: c.Name}
		if c.Hook != nil {
			ch.Hook, ch.Priority = nftnl.HookName(c.Hook.Num), c.Hook.Priority
			ch.Policy = nftnl.Verdict{Code: int32(c.Policy)}.String()
		}
		for _, r := range c.Rules {
			ch.Rules = append(ch.Rules, nftnl.ExprText(r))
		}
		t.Chains = append(t.Chains, ch)
	}
	for _, s := range nt.Sets {
		set := Set{Name: s.Name, Type: s.Key.String(), Interval: s.Interval}
		if s.Data != 0 {
			set.DataType = s.Data.String()
		}
		els := sortedElems(nt.Elems[s.Name])
		if s.Interval && len(s.Key.Fields()) == 1 {
			set.Elements = addrRanges(els)
		} else {
			for _, e := range els {
				set.Elements = append(set.Elements, element(s, e))
			}
		}
		t.Sets = append(t.Sets, set)
	}
	for _, m := range []string{setServiceIPs, setServiceNodePorts} {
		s := nt.Set(m)
		if s == nil {
			continue
		}
		for _, e := range sortedElems(nt.Elems[m]) {
			if e.Verdict == nil {
				continue
			}
			r := Route{Map: m, Key: nftnl.ValueText(e.Key, s.Key), Verdict: e.Verdict.String()}
			if f, ok := nt.FlowOf(s, e.Key); ok && e.Verdict.Chain != "" {
				o := nt.Follow(e.Verdict.Chain, f)
				r.Chain, r.Endpoints, r.SomeSources, r.Affinity, r.Verdicts = e.Verdict.Chain, o.Endpoints, o.Some, o.Affinity, o.Verdicts
				for _, p := range o.Pins {
					r.Remembered = append(r.Remembered, Pin(p))
				}
			}
			t.Routes = append(t.Routes, r)
		}
	}
	return t
}

func sortedElems(els []nftnl.Elem) []nftnl.Elem {
	return slices.SortedStableFunc(slices.Values(els), func(a, b nftnl.Elem) int {
		return cmp.Or(bytes.Compare(a.Key, b.Key), cmp.Compare(btoi(a.IntervalEnd), btoi(b.IntervalEnd)))
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// element formats an element of any set but a single-field interval set.
func element(s *nftnl.Set, e nftnl.Elem) Element {
	el := Element{Key: nftnl.ValueText(e.Key, s.Key)}
	if e.KeyEnd != nil {
		el.Key += " - " + nftnl.ValueText(e.KeyEnd, s.Key)
	}
	switch {
	case e.Verdict != nil:
		el.Data = e.Verdict.String()
	case e.Val != nil:
		el.Data = nftnl.ValueText(e.Val, s.Data)
	}
	return el
}

// addrRanges formats the elements of an interval set of addresses, sorted
// by key: each range starts at an element and ends before the interval
// end that follows it, or runs to the last address.
func addrRanges(els []nftnl.Elem) []Element {
	var out []Element
	for i := 0; i < len(els); i++ {
		if els[i].IntervalEnd {
			continue
		}
		start, ok := netip.AddrFromSlice(els[i].Key)
		if !ok {
			continue
		}
		var last netip.Addr
		if i+1 < len(els) && els[i+1].IntervalEnd {
			end, _ := netip.AddrFromSlice(els[i+1].Key)
			last = end.Prev()
			i++
		} else {
			last = nftnl.LastAddr(netip.PrefixFrom(start, 0))
		}
		out = append(out, Element{Key: rangeText(start, last)})
	}
	return out
}

// rangeText returns [first, last] as a prefix when it is one.
func rangeText(first, last netip.Addr) string {
	for bits := first.BitLen(); bits >= 0; bits-- {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() != first {
			break
		}
		if nftnl.LastAddr(p) == last {
			return p.String()
		}
	}
	return first.String() + "-" + last.String()
}

var _ proxier.Inspector = (*backend)(nil)

// Inspect implements [proxier.Inspector]: it reads the backend's table
// back from the kernel and returns its frontends. A table that does not
// exist holds none.
func (b *backend) Inspect(ctx context.Context) ([]proxier.Frontend, error) {
	if b.ns == nil {
		return nil, errors.New("nftables: backend is closed")
	}
	return readFrontends(ctx, b.ns, b.fi.fam, b.cfg.TableName)
}

// Inspect reads what a proxier configured by cfg programmed in family,
// from the kernel and without a proxier: the frontends of the table
// cfg.TableName (empty: [DefaultTableName]) in cfg.NetNS. A table that
// does not exist holds none.
func Inspect(ctx context.Context, cfg Config, family model.IPFamily) ([]proxier.Frontend, error) {
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("nftables: unknown IP family %v", family)
	}
	cfg = cfg.WithDefaults()
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer ns.Close()
	return readFrontends(ctx, ns, family, cfg.TableName)
}

func readFrontends(ctx context.Context, ns *netns.NS, family model.IPFamily, table string) ([]proxier.Frontend, error) {
	c, err := nftnl.Dial(ns)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer c.Close()
	nt, err := c.ReadTable(ctx, nftnl.FamilyOf(family).Proto, table)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return frontendsOf(nt, family), nil
}

// frontendsOf returns the frontends of a table: the elements of the
// dispatch maps (service-ips, service-nodeports) followed through the
// rules to their endpoints, those of the no-endpoint maps with their
// verdicts, and the source ranges of the firewall.
func frontendsOf(nt *nftnl.Table, family model.IPFamily) []proxier.Frontend {
	var out []proxier.Frontend
	for _, m := range []string{setServiceIPs, setServiceNodePorts, setNoEndpointIPs, setNoEndpointPorts} {
		s := nt.Set(m)
		if s == nil {
			continue
		}
		for _, e := range sortedElems(nt.Elems[m]) {
			fl, ok := nt.FlowOf(s, e.Key)
			if !ok || e.Verdict == nil {
				continue
			}
			proto, ok := model.ProtocolOfNumber(fl.Proto)
			if !ok {
				continue
			}
			f := proxier.Frontend{Protocol: proto, Port: fl.Dport, Detail: m + " -> " + e.Verdict.String()}
			if fl.Daddr != nil {
				f.Addr, _ = netip.AddrFromSlice(fl.Daddr)
			}
			if e.Verdict.Chain == "" {
				f.Verdict = e.Verdict.String()
			} else {
				o := nt.Follow(e.Verdict.Chain, fl)
				f.Endpoints, f.SomeSources, f.Affinity = o.Endpoints, o.Some, o.Affinity
				if len(o.Verdicts) > 0 {
					f.Verdict = o.Verdicts[0]
				}
			}
			out = append(out, f)
		}
	}
	out = mergeFrontends(out)
	ranges := firewallRanges(nt, family)
	for i := range out {
		k := fwKey{out[i].Addr, out[i].Protocol, out[i].Port}
		out[i].SourceRanges = ranges[k]
	}
	return out
}

// fwKey is a load-balancer IP's address, protocol and port.
type fwKey struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

// firewallRanges returns the admitted sources of each frontend of the
// firewall-ips set, from the firewall-allow set (keys address . protocol
// . port . source range, each field padded to 4 bytes).
func firewallRanges(nt *nftnl.Table, family model.IPFamily) map[fwKey][]netip.Prefix {
	if nt.Set(setFirewallAllow) == nil {
		return nil
	}
	n := 4
	if family == model.IPv6 {
		n = 16
	}
	field := func(k []byte) (fwKey, netip.Addr, bool) {
		if len(k) != 2*n+8 {
			return fwKey{}, netip.Addr{}, false
		}
		a, _ := netip.AddrFromSlice(k[:n])
		proto, ok := model.ProtocolOfNumber(k[n])
		src, _ := netip.AddrFromSlice(k[n+8:])
		return fwKey{a, proto, binary.BigEndian.Uint16(k[n+4:])}, src, ok
	}
	out := map[fwKey][]netip.Prefix{}
	for _, e := range nt.Elems[setFirewallAllow] {
		k, first, ok := field(e.Key)
		last := first
		if e.KeyEnd != nil {
			_, last, ok = field(e.KeyEnd)
		}
		if ok && first.IsValid() && last.IsValid() {
			out[k] = append(out[k], nftnl.RangePrefixes(first, last)...)
		}
	}
	// A frontend in firewall-ips with no admitted source admits none.
	for _, e := range nt.Elems[setFirewallIPs] {
		if fl, ok := nt.FlowOf(nt.Set(setFirewallIPs), e.Key); ok {
			if p, ok := model.ProtocolOfNumber(fl.Proto); ok {
				a, _ := netip.AddrFromSlice(fl.Daddr)
				k := fwKey{a, p, fl.Dport}
				if _, ok := out[k]; !ok {
					out[k] = []netip.Prefix{}
				}
			}
		}
	}
	return out
}

// mergeFrontends merges the frontends read for one address, protocol and
// port from a dispatch map and a no-endpoint map: the no-endpoint map's
// verdict applies to some sources (those outside the cluster, with
// externalTrafficPolicy Local and no local endpoint), the dispatch map's
// endpoints to the others. An endpoint every source reaches is not
// listed among those only some reach.
func mergeFrontends(fs []proxier.Frontend) []proxier.Frontend {
	idx := map[fwKey]int{}
	var out []proxier.Frontend
	for _, f := range fs {
		k := fwKey{f.Addr, f.Protocol, f.Port}
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, f)
			continue
		}
		m := &out[i]
		m.SomeSources = append(append(m.SomeSources, m.Endpoints...), append(f.Endpoints, f.SomeSources...)...)
		m.Endpoints = nil
		m.Verdict = cmp.Or(m.Verdict, f.Verdict)
		m.Affinity = m.Affinity || f.Affinity
		m.Detail += ", " + f.Detail
	}
	for i := range out {
		f := &out[i]
		f.SomeSources = slices.DeleteFunc(f.SomeSources, func(a netip.AddrPort) bool { return slices.Contains(f.Endpoints, a) })
		slices.SortFunc(f.SomeSources, netip.AddrPort.Compare)
		f.SomeSources = slices.Compact(f.SomeSources)
	}
	return out
}
