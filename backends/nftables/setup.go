package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Defaults of [Config].
const (
	DefaultTableName       = "proxykit"
	DefaultAffinityMapSize = 1 << 18
)

// Config configures the nftables backend. The zero value is valid.
type Config struct {
	proxier.Config

	// TableName names the table the backend owns in each family
	// ("ip NAME" and "ip6 NAME"). Empty means [DefaultTableName].
	TableName string
	// MasqueradeBit is the packet mark bit that asks for masquerading in
	// postrouting. Zero means [proxier.DefaultMasqueradeBit] (kube-proxy's).
	MasqueradeBit uint32
	// AffinityMapSize bounds the number of clients remembered for session
	// affinity, per family. Zero means [DefaultAffinityMapSize].
	AffinityMapSize uint32
}

// WithDefaults returns c with every zero field that has a default filled in.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.TableName == "" {
		c.TableName = DefaultTableName
	}
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = proxier.DefaultMasqueradeBit
	}
	if c.AffinityMapSize == 0 {
		c.AffinityMapSize = DefaultAffinityMapSize
	}
	return c
}

// New returns a Proxier that programs cfg.NetNS with nftables, one table
// per IP family of cfg.Families.
//
// New probes the kernel first; if it lacks a feature the backend needs,
// the error matches [proxier.ErrNotSupported] and names the feature.
func New(cfg Config) (proxier.Proxier, error) {
	cfg = cfg.WithDefaults()
	return proxier.NewPerFamily(cfg.Config, func(f model.IPFamily) (proxier.Backend, error) {
		return NewBackend(cfg, f)
	})
}

// NewBackend returns the backend of one IP family, for use without the
// engine (tests, or a caller that computes targets itself). It opens
// cfg.NetNS and probes the kernel like [New].
func NewBackend(cfg Config, family model.IPFamily) (proxier.Backend, error) {
	cfg = cfg.WithDefaults()
	if family != model.IPv4 && family != model.IPv6 {
		return nil, fmt.Errorf("nftables: unknown IP family %v", family)
	}
	if bits := cfg.MasqueradeBit; bits&(bits-1) != 0 {
		return nil, fmt.Errorf("nftables: masquerade bit %#x is not a single bit", bits)
	}
	if len(cfg.TableName) > maxChainName {
		return nil, errors.New("nftables: table name too long")
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	// One proxier per table: a second one would take it over and
	// silently kill the first one's services.
	tfam := "ip"
	if family == model.IPv6 {
		tfam = "ip6"
	}
	lock, err := ownerlock.Acquire(ns, fmt.Sprintf("nftables %s %s", tfam, cfg.TableName))
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("nftables: table %s %s: %w", tfam, cfg.TableName, err)
	}
	c, err := dial(ns)
	if err != nil {
		lock.Release()
		ns.Close()
		return nil, fmt.Errorf("nftables: %w", err)
	}
	b, err := newBackend(cfg, family, c)
	if err != nil {
		c.close()
		lock.Release()
		ns.Close()
		return nil, err
	}
	b.ns, b.lock = ns, lock
	if err := b.probe(context.Background()); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// newBackend returns the backend of one family of a configuration with
// defaults, writing through c: the kernel's connection, or a recorder in
// tests. It neither probes nor takes the table's lock.
func newBackend(cfg Config, family model.IPFamily, c *conn) (*backend, error) {
	b := &backend{
		cfg:  cfg,
		fi:   familyInfoOf(family),
		conn: c,
		log:  cfg.Logger.With("backend", "nftables", "family", family.String(), "table", cfg.TableName),
	}
	var err error
	if b.r, err = newRenderer(b.fi, cfg.MasqueradeBit, cfg.AffinityMapSize, cfg.MasqueradeAll, len(b.clusterCIDRs()) > 0, cfg.NodeIP(b.fi.fam)); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	if b.metrics, err = newSyncMetrics(cfg.Config, family); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return b, nil
}

// probe checks that the kernel accepts everything the backend programs,
// by sending the full skeleton in a transaction that creates and deletes
// a scratch table. Nothing stays behind, even if the process dies.
func (b *backend) probe(ctx context.Context) error {
	name := fmt.Sprintf("%s-probe-%d", b.cfg.TableName, os.Getpid())
	tx := nftnl.NewBatch(b.fi.proto, name)
	tx.AddTable()
	if err := b.addSkeleton(tx); err != nil {
		return err
	}
	// A sample service chain, with and without affinity.
	tx.AddChain("probe", nil)
	for _, r := range b.fi.sampleServiceRules() {
		enc, err := encodeExprs(b.fi.proto, r)
		if err != nil {
			return err
		}
		tx.AddRule("probe", enc)
	}
	tx.DelTable()
	err := b.conn.Commit(ctx, tx)
	if err == nil {
		return nil
	}
	var txErr *TxError
	if !errors.As(err, &txErr) {
		return fmt.Errorf("nftables: probe: %w", err)
	}
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("nftables: probe: %w (CAP_NET_ADMIN is needed)", err)
	}
	// Name the missing feature: probe each on its own.
	for _, f := range b.features() {
		tx := nftnl.NewBatch(b.fi.proto, name)
		tx.AddTable()
		f.add(tx)
		tx.DelTable()
		if ferr := b.conn.Commit(ctx, tx); ferr != nil {
			return &proxier.UnsupportedError{Backend: "nftables", What: f.name, Err: ferr}
		}
	}
	return &proxier.UnsupportedError{Backend: "nftables", What: "the backend's ruleset", Err: err}
}

type feature struct {
	name string
	add  func(tx *nftnl.Batch)
}

// features lists what the backend needs, each with a minimal use.
func (b *backend) features() []feature {
	fi := &b.fi
	rl := func(tx *nftnl.Batch, chain string, h *nftnl.Hook, r rule) {
		tx.AddChain(chain, h)
		enc, err := encodeExprs(fi.proto, r)
		if err != nil {
			tx.SetErr(err)
			return
		}
		tx.AddRule(chain, enc)
	}
	natHook := &nftnl.Hook{Num: unix.NF_INET_PRE_ROUTING, Priority: prioDNAT, Type: "nat"}
	filterHook := &nftnl.Hook{Num: unix.NF_INET_LOCAL_IN, Priority: prioFilterPreDNAT, Type: "filter"}
	specs := fi.fixedSetSpecs()
	set := func(tx *nftnl.Batch, name string) {
		for _, s := range specs {
			if s.Name == name {
				tx.AddSet(s)
			}
		}
	}
	return []feature{
		{"nf_tables NAT chains (nft_chain_nat)", func(tx *nftnl.Batch) { tx.AddChain("c", natHook) }},
		{"nft_ct", func(tx *nftnl.Batch) { rl(tx, "c", filterHook, nftnl.CtStateNew()) }},
		{"nft_fib", func(tx *nftnl.Batch) { rl(tx, "c", filterHook, nftnl.FibLocal(false, expr.CmpOpEq)) }},
		{"nft_reject", func(tx *nftnl.Batch) { rl(tx, "c", filterHook, fi.rejectRule()) }},
		{"nft_numgen", func(tx *nftnl.Batch) {
			rl(tx, "c", nil, rule{&expr.Numgen{Register: nftnl.Reg(0), Modulus: randRange, Offset: 1 << 16, Type: unix.NFT_NG_RANDOM}})
		}},
		{"nft_masq", func(tx *nftnl.Batch) {
			rl(tx, "c", &nftnl.Hook{Num: unix.NF_INET_POST_ROUTING, Priority: prioSNAT, Type: "nat"}, rule{&expr.Masq{FullyRandom: true}})
		}},
		{"concatenated interval sets (nft_set_pipapo)", func(tx *nftnl.Batch) { set(tx, setFirewallAllow) }},
		{"interval sets (nft_set_rbtree)", func(tx *nftnl.Batch) { set(tx, setClusterCIDRs) }},
		{"interval maps with data registers and DNAT from registers (nft_nat)", func(tx *nftnl.Batch) {
			tx.AddSet(fi.endpointsMapSpec(0, 0))
			rl(tx, "c", natHook, fi.tupleRule(0, 0))
		}},
		{"dynamic sets with timeouts (nft_dynset)", func(tx *nftnl.Batch) {
			tx.AddSet(fi.affinitySetSpec(0, 16))
			tx.AddChain("c", natHook)
			for _, r := range fi.sampleServiceRules()[3:] {
				enc, err := encodeExprs(fi.proto, r)
				if err != nil {
					tx.SetErr(err)
					return
				}
				tx.AddRule("c", enc)
			}
		}},
	}
}

// addSkeleton adds the fixed sets, chains and rules, and the objects of
// shard 0, to tx.
func (b *backend) addSkeleton(tx *nftnl.Batch) error {
	for _, s := range b.fi.fixedSetSpecs() {
		tx.AddSet(s)
	}
	chains := b.skeletonChains()
	for kind := objEndpoints; kind <= objNodePort; kind++ {
		o, err := b.r.object(shardRef{kind: kind}, 1)
		if err != nil {
			return err
		}
		if o.set != nil {
			tx.AddSet(o.set)
		} else {
			chains = append(chains, *o.chain)
		}
	}
	for i := range chains {
		if err := b.r.encode(&chains[i]); err != nil {
			return err
		}
		tx.AddChain(chains[i].name, chains[i].hook)
	}
	for i := range chains {
		for _, r := range chains[i].enc {
			tx.AddRule(chains[i].name, r)
		}
	}
	return nil
}

// sampleServiceRules returns the rules of a service chain: balancing, then
// balancing with affinity over two endpoints.
func (fi *familyInfo) sampleServiceRules() []rule {
	eps := []netip.AddrPort{netip.AddrPortFrom(fi.sampleAddr(), 80), netip.AddrPortFrom(fi.sampleAddr(), 81)}
	rules := []rule{fi.tupleRule(0, 0), fi.nodePortRule(0, 0), fi.prefixRule(0, 0, groupPrefix(2))}
	return append(rules, fi.affinityRules(0, []uint32{1, 2}, eps, time.Second)...)
}

// sampleAddr is an address of the family.
func (fi *familyInfo) sampleAddr() netip.Addr {
	if fi.AddrLen == 4 {
		return netip.AddrFrom4([4]byte{192, 0, 2, 1})
	}
	return netip.MustParseAddr("2001:db8::1")
}

func (b *backend) skeletonChains() []chainObj {
	return b.fi.skeleton(b.cfg.MasqueradeBit, len(b.nodePortPrefixes()) > 0, b.cfg.MasqueradeAll, len(b.clusterCIDRs()) > 0)
}

// clusterCIDRs returns the configured pod networks of the backend's family.
func (b *backend) clusterCIDRs() [][2]netip.Addr {
	return normalizeRanges(b.fi.fam, b.cfg.ClusterCIDRs)
}

// nodePortPrefixes returns the configured node port addresses of the
// backend's family.
func (b *backend) nodePortPrefixes() [][2]netip.Addr {
	return normalizeRanges(b.fi.fam, b.cfg.NodePortAddresses)
}

// staticElems returns the elements that come from the configuration and
// the service ranges of st.
func (b *backend) staticElems(st *state) []setElem {
	var out []setElem
	for _, e := range b.fi.intervalElems(normalizeRanges(b.fi.fam, st.serviceCIDRs)) {
		out = append(out, setElem{set: setServiceCIDRs, e: e})
	}
	for _, e := range b.fi.intervalElems(b.clusterCIDRs()) {
		out = append(out, setElem{set: setClusterCIDRs, e: e})
	}
	for _, e := range b.fi.intervalElems(b.nodePortPrefixes()) {
		out = append(out, setElem{set: setNodePortIPs, e: e})
	}
	return out
}

func (b *backend) String() string {
	return "nftables " + strings.ToLower(b.fi.fam.String()) + " " + b.cfg.TableName
}
