package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// NorthSouth names what serves the traffic that arrives at the node
// from outside: node ports, external and load-balancer IPs.
type NorthSouth string

const (
	// NorthSouthNFTables composes the nftables backend (a table of its
	// own). It is the default.
	NorthSouthNFTables NorthSouth = "nftables"
	// NorthSouthTC serves it with tc programs (bpf/nodeport.c) on the
	// node's interfaces, without any netfilter rule: frontend lookup,
	// random or Maglev endpoint pick, DNAT, SNAT to the node for a remote
	// endpoint (externalTrafficPolicy Cluster), connection tracking and
	// reverse NAT in LRU maps, forwarding with bpf_fib_lookup and
	// bpf_redirect/bpf_redirect_neigh. Programs attach with tcx links
	// (kernel 6.6+), else with a clsact qdisc and a cls_bpf filter.
	NorthSouthTC NorthSouth = "tc"
)

// Forwarding names how the tc and XDP programs send traffic from
// outside the node to an endpoint on another node
// (externalTrafficPolicy Cluster).
type Forwarding string

const (
	// ForwardingSNAT SNATs it to the node's address, as kube-proxy
	// does: the endpoint sees the node and replies through it. It is
	// the default.
	ForwardingSNAT Forwarding = "snat"
	// ForwardingDSR sends it by direct server return: the packet,
	// translated to the endpoint but keeping the client's address, goes
	// to the endpoint wrapped in IPIP (IPv6: IP6IP6) from the frontend's
	// address; the endpoint's node unwraps it, and the endpoint sees the
	// client and replies to it directly, from the frontend. The
	// endpoint's node must run the tc programs too, and the network
	// between the nodes must carry IPIP and let the endpoint's node
	// reach the client.
	ForwardingDSR Forwarding = "dsr"
	// ForwardingHybrid is ForwardingDSR for TCP and ForwardingSNAT for
	// UDP (whose replies, without a connection, may come from anywhere).
	ForwardingHybrid Forwarding = "hybrid"
)

// checkNorthSouth reports a NorthSouth setting that cannot work.
func (c *Config) checkNorthSouth() error {
	switch c.NorthSouth {
	case "", NorthSouthNFTables:
		return nil
	case NorthSouthTC, NorthSouthXDP:
		if c.SocketOnly {
			return fmt.Errorf("ebpf: Config.NorthSouth %s and Config.SocketOnly contradict each other", c.NorthSouth)
		}
		return nil
	}
	return fmt.Errorf("ebpf: unknown Config.NorthSouth %q (want %q, %q or %q)", c.NorthSouth, NorthSouthNFTables, NorthSouthTC, NorthSouthXDP)
}

// checkForwarding reports an unknown NorthSouthForwarding.
func (c *Config) checkForwarding() error {
	switch c.NorthSouthForwarding {
	case "", ForwardingSNAT, ForwardingDSR, ForwardingHybrid:
		return nil
	}
	return fmt.Errorf("ebpf: unknown Config.NorthSouthForwarding %q (want %q, %q or %q)", c.NorthSouthForwarding, ForwardingSNAT, ForwardingDSR, ForwardingHybrid)
}

// Map names of bpf/nodeport.c.
const (
	mapNSFe    = "pk_nsfe"
	mapNSBe    = "pk_nsbe"
	mapNSCt    = "pk_nsct"
	mapNSRev   = "pk_nsrev"
	mapIfAddr  = "pk_ifaddr"
	mapNSAff   = "pk_nsaff"
	mapNSRange = "pk_nsrange"
	mapNSLoc   = "pk_nsloc"
	mapNSMag   = "pk_nsmag"
)

// tcFilterPriority and tcFilterHandle identify the cls_bpf filters of
// the clsact path on ingress.
const (
	tcFilterPriority = 0xc0de
	tcFilterHandle   = 0x70
)

// tcPlane is the north-south datapath at tc that both family backends
// of a proxier share: the programs and maps of bpf/nodeport.c, and
// their attachment to the interfaces of the node's namespace.
type tcPlane struct {
	cfg  Config
	log  *slog.Logger
	objs nodeportObjects
	ns   *netns.NS
	nl   *netlink.Handle
	// snat is the source port range of SNATed flows (Config.snatPorts).
	snat [2]uint16

	mu     sync.Mutex
	refs   int
	closed bool
	// legacy says tcx is missing (or refused): clsact and cls_bpf.
	legacy bool
	// atts are the attachments by interface index.
	atts map[int]*tcAttachment
	// ifaddrs is what pk_ifaddr holds.
	ifaddrs map[ifaddrKey][16]byte
	// xdp is the XDP program in front of the tc programs on the
	// external interfaces, with NorthSouthXDP (else nil).
	xdp *xdpPart
	// metrics receives the fill of the connection tracking maps, which
	// ct counts at a refresh, at most every ctEvery (the last count at
	// ctAt); ct is empty without Config.Registerer.
	metrics  *mapMetrics
	ct       []*entryCounter
	ctEvery  time.Duration
	ctAt     time.Time
	ctWarned bool
}

// ctCountInterval is how often at most a refresh counts the connection
// tracking maps. A count reads every entry: about 20 ms for a full map
// of 65,536 flows on a 2-CPU VM (BenchmarkCTCount), too much for every
// incremental sync of both families while endpoints churn; the periodic
// full syncs (every 30 s by default) keep the figures fresh.
const ctCountInterval = 10 * time.Second

// tcAttachment is one interface's programs: on its ingress, and on
// the egress of an external one (pk_tc_out, the node's own packets).
type tcAttachment struct {
	ifindex int
	name    string
	ext     bool
	link    link.Link          // tcx, ingress
	filter  *netlink.BpfFilter // clsact, ingress
	out     link.Link          // tcx, egress
	outF    *netlink.BpfFilter // clsact, egress
}

// links returns a's tcx links.
func (a *tcAttachment) links() []link.Link {
	var ls []link.Link
	for _, l := range []link.Link{a.link, a.out} {
		if l != nil {
			ls = append(ls, l)
		}
	}
	return ls
}

// ifaddrKey is the key of pk_ifaddr.
type ifaddrKey struct {
	Ifindex uint32
	Family  uint32
}

// newTCPlaneFor returns the tc plane of cfg, or nil unless
// cfg.NorthSouth is tc. It probes the kernel and loads the programs;
// nothing is attached before the first sync. It holds one reference,
// dropped with release.
func newTCPlaneFor(cfg Config, dp *dataplane) (*tcPlane, error) {
	if cfg.NorthSouth != NorthSouthTC && cfg.NorthSouth != NorthSouthXDP {
		return nil, nil
	}
	if err := probeTC(); err != nil {
		return nil, err
	}
	p := &tcPlane{
		cfg:     cfg,
		log:     cfg.Logger.With("backend", "ebpf", "part", "tc"),
		refs:    1,
		legacy:  cfg.tcLegacy,
		atts:    map[int]*tcAttachment{},
		ifaddrs: map[ifaddrKey][16]byte{},
		metrics: dp.metrics,
		ctEvery: ctCountInterval,
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("ebpf: tc: %w", err)
	}
	p.ns = ns
	var local [2]uint16
	if err := ns.Do(func() (err error) { local, err = readLocalPortRange(); return err }); err != nil {
		ns.Close()
		return nil, fmt.Errorf("ebpf: tc: the node's ephemeral ports: %w", err)
	}
	lo, hi, err := cfg.snatPorts(local)
	if err != nil {
		ns.Close()
		return nil, err
	}
	p.snat = [2]uint16{lo, hi}
	p.log.Debug("SNAT source ports", "first", lo, "last", hi, "ephemeral", fmt.Sprintf("%d-%d", local[0], local[1]))
	if p.nl, err = ns.NetlinkHandle(unix.NETLINK_ROUTE); err != nil {
		ns.Close()
		return nil, fmt.Errorf("ebpf: tc: netlink: %w", err)
	}
	if err := p.load(dp); err != nil {
		p.nl.Close()
		ns.Close()
		return nil, err
	}
	if cfg.Registerer != nil {
		p.ct = []*entryCounter{newEntryCounter(p.objs.PkNsct, mapNSCt), newEntryCounter(p.objs.PkNsrev, mapNSRev)}
	}
	return p, nil
}

// probeTC checks the program type and helpers the tc programs use.
func probeTC() error {
	if err := features.HaveProgramType(ebpf.SchedCLS); err != nil {
		return unsupported("tc (sched_cls) programs", err)
	}
	for _, h := range []struct {
		fn   asm.BuiltinFunc
		name string
	}{
		{asm.FnFibLookup, "bpf_fib_lookup (kernel 4.18)"},
		{asm.FnRedirectNeigh, "bpf_redirect_neigh (kernel 5.10)"},
		{asm.FnCsumDiff, "bpf_csum_diff"},
	} {
		if err := features.HaveProgramHelper(ebpf.SchedCLS, h.fn); err != nil {
			return unsupported("helper "+h.name+" in tc programs", err)
		}
	}
	return nil
}

// load loads bpf/nodeport.c with the socket programs' node address
// maps. With PinPath its own maps are pinned there (see tc_pin.go).
func (p *tcPlane) load(dp *dataplane) error {
	spec, err := loadNodeport()
	if err != nil {
		return fmt.Errorf("ebpf: tc: %w", err)
	}
	if err := setSNATPorts(spec, p.snat); err != nil {
		return err
	}
	nfam := max(len(p.cfg.Families), 1)
	sizes := map[string]int{
		mapNSFe:  nfam * p.cfg.MaxServices,
		mapNSBe:  nfam * p.cfg.MaxBackends,
		mapNSCt:  p.cfg.MaxSockets,
		mapNSRev: p.cfg.MaxSockets,
		mapNSAff: nfam * p.cfg.MaxAffinity,
		mapNSLoc: nfam * p.cfg.MaxBackends,
		mapNSMag: nfam * p.cfg.MaxMaglevTables,
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	if err := setMaglevSize(spec, p.cfg.MaglevTableSize); err != nil {
		return err
	}
	for _, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		mapNode4: dp.objs.PkNode4,
		mapNode6: dp.objs.PkNode6,
	}}
	if err := p.pinMapsSpec(spec, opts); err != nil {
		return err
	}
	spec.Maps[mapNode4].MaxEntries = dp.objs.PkNode4.MaxEntries()
	spec.Maps[mapNode6].MaxEntries = dp.objs.PkNode6.MaxEntries()
	if err := spec.LoadAndAssign(&p.objs, opts); err != nil {
		return tcLoadError(err)
	}
	if p.cfg.NorthSouth == NorthSouthXDP {
		if err := p.loadXDP(); err != nil {
			p.objs.Close()
			return err
		}
	}
	return nil
}

// tcLoadError names what failed to load, with the verifier's log.
func tcLoadError(err error) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return &proxier.UnsupportedError{Backend: "ebpf", What: "the tc programs (bpf/nodeport.c) on kernel " + kernelRelease(),
			Err: fmt.Errorf("%+v", verr)}
	}
	return loadError("the tc programs (bpf/nodeport.c)", err)
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// release drops a reference; the last one detaches the programs and
// closes everything. A nil plane does nothing.
func (p *tcPlane) release() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refs--
	if p.refs > 0 || p.closed {
		return nil
	}
	p.closed = true
	var err error
	if p.cfg.PinPath != "" {
		// Everything stays attached for the next proxier (tc_pin.go):
		// only this process's handles go.
		err = p.closeHandlesLocked()
	} else {
		err = p.detachAllLocked()
	}
	return errors.Join(err, p.closeXDPLocked(), p.objs.Close(), p.nsClose())
}

// closeHandlesLocked closes this process's handles of the pinned links,
// which stay attached, and forgets the attachments (clsact filters stay
// by themselves).
func (p *tcPlane) closeHandlesLocked() error {
	var errs []error
	for idx, a := range p.atts {
		for _, l := range a.links() {
			errs = append(errs, l.Close())
		}
		delete(p.atts, idx)
	}
	return errors.Join(append(errs, p.releaseXDPLocked(link.Link.Close))...)
}

func (p *tcPlane) nsClose() error {
	p.nl.Close()
	return p.ns.Close()
}

func (p *tcPlane) acquire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refs++
}

// tcDevice is an interface of the node's namespace the programs attach
// to, and whether it is external (frontends are served there).
type tcDevice struct {
	index int
	name  string
	ext   bool
	addrs []netip.Prefix
}

// devices lists the Ethernet interfaces of the node's namespace.
func (p *tcPlane) devices() ([]tcDevice, error) {
	links, err := p.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("ebpf: tc: list interfaces: %w", err)
	}
	var out []tcDevice
	for _, l := range links {
		a := l.Attrs()
		if a.EncapType != "ether" || a.Flags&unix.IFF_LOOPBACK != 0 {
			continue
		}
		d := tcDevice{index: a.Index, name: a.Name}
		addrs, err := p.nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("ebpf: tc: addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			ip, ok := netip.AddrFromSlice(ad.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue
			}
			ones, _ := ad.Mask.Size()
			d.addrs = append(d.addrs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		d.ext = p.external(d)
		out = append(out, d)
	}
	return out, nil
}

// external says whether frontends are served on d: it is named in
// NorthSouthDevices, or (without that list) holds a global address
// with a prefix shorter than a host route.
func (p *tcPlane) external(d tcDevice) bool {
	if len(p.cfg.NorthSouthDevices) > 0 {
		return slices.Contains(p.cfg.NorthSouthDevices, d.name)
	}
	return slices.ContainsFunc(d.addrs, func(a netip.Prefix) bool { return a.Bits() < a.Addr().BitLen() })
}

// refresh attaches the programs to the interfaces that appeared (or
// changed role) since the last call, forgets those that are gone, and
// writes the interfaces' addresses (the SNAT sources) to pk_ifaddr. An
// interface deleted and created again under its name has a new index:
// it is attached as a new one, and the old index's attachment and
// addresses are dropped. It also counts the connection tracking maps
// for the metrics.
func (p *tcPlane) refresh() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	p.observeCTLocked()
	devs, err := p.devices()
	if err != nil {
		return err
	}
	if err := p.writeAddrs(devs); err != nil {
		return err
	}
	seen := map[int]bool{}
	var errs []error
	for _, d := range devs {
		seen[d.index] = true
		if a := p.atts[d.index]; a != nil && a.ext == d.ext && a.name == d.name {
			continue
		}
		if err := p.attachLocked(d); err != nil {
			errs = append(errs, err)
		}
	}
	for idx, a := range p.atts {
		if !seen[idx] {
			// The interface is gone, and its programs with it.
			for _, l := range a.links() {
				dropLink(l)
			}
			delete(p.atts, idx)
		}
	}
	errs = append(errs, p.refreshXDPLocked(devs))
	return errors.Join(errs...)
}

// observeCTLocked counts the entries of pk_nsct and pk_nsrev into the
// metrics, unless it did less than ctEvery ago. A failure is logged
// (once) and leaves the gauges as they were: the figures must not fail
// a sync.
func (p *tcPlane) observeCTLocked() {
	now := time.Now()
	if !p.ctAt.IsZero() && now.Sub(p.ctAt) < p.ctEvery {
		return
	}
	p.ctAt = now
	for _, c := range p.ct {
		n, err := c.count()
		if err != nil {
			if !p.ctWarned {
				p.log.Warn("cannot count the connection tracking entries for the metrics", "error", err)
				p.ctWarned = true
			}
			continue
		}
		p.metrics.observeCT(c.name, n, int(c.m.MaxEntries()))
	}
}

// writeAddrs makes pk_ifaddr hold the first address of each family of
// every device.
func (p *tcPlane) writeAddrs(devs []tcDevice) error {
	want := map[ifaddrKey][16]byte{}
	for _, d := range devs {
		for _, a := range d.addrs {
			fam := uint32(unix.AF_INET)
			if a.Addr().Is6() {
				fam = unix.AF_INET6
			}
			k := ifaddrKey{Ifindex: uint32(d.index), Family: fam}
			if _, ok := want[k]; !ok {
				want[k] = mapped16(a.Addr())
			}
		}
	}
	var putK []ifaddrKey
	var putV [][16]byte
	var del []ifaddrKey
	for k, v := range want {
		if h, ok := p.ifaddrs[k]; !ok || h != v {
			putK, putV = append(putK, k), append(putV, v)
		}
	}
	for k := range p.ifaddrs {
		if _, ok := want[k]; !ok {
			del = append(del, k)
		}
	}
	if err := errors.Join(batchPut(p.objs.PkIfaddr, putK, putV), batchDel(p.objs.PkIfaddr, del)); err != nil {
		p.ifaddrs = map[ifaddrKey][16]byte{} // unknown: rewrite next time
		return fmt.Errorf("ebpf: tc: %w", err)
	}
	p.ifaddrs = want
	return nil
}

// program returns the program for a device of the role ext.
func (p *tcPlane) program(ext bool) *ebpf.Program {
	if ext {
		return p.objs.PkTcExt
	}
	return p.objs.PkTcPod
}

// tcHook is where a tc program runs: an interface's ingress or egress.
type tcHook struct {
	name   string
	tcx    ebpf.AttachType
	parent uint32 // the clsact filter's
	pin    string // prefix of the pinned tcx link's file name
}

var (
	tcIngress = tcHook{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, tcxLinkPin}
	tcEgress  = tcHook{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, tcxOutLinkPin}
)

// attachLocked attaches the program of d's role to its ingress and, on
// an external interface, pk_tc_out to its egress, replacing earlier
// attachments (an interface no longer external loses its egress one).
func (p *tcPlane) attachLocked(d tcDevice) error {
	old := p.atts[d.index]
	if old == nil {
		old = &tcAttachment{}
	}
	a := &tcAttachment{ifindex: d.index, name: d.name, ext: d.ext}
	var err error
	a.link, a.filter, err = p.attachHook(d, tcIngress, p.program(d.ext), old.link)
	if err == nil && d.ext {
		a.out, a.outF, err = p.attachHook(d, tcEgress, p.objs.PkTcOut, old.out)
	}
	if err != nil {
		return err
	}
	if old.link != nil && a.link == nil {
		dropLink(old.link) // tcx refused: clsact now
	}
	if old.out != nil && a.out == nil {
		dropLink(old.out)
	}
	if old.outF != nil && a.outF == nil {
		if err := p.delFilter(old.outF, old.name); err != nil {
			// Kept, so that the next attach or the detach tries
			// again; until then it serves only the SCTP frontends'
			// packets the node sends out of this interface.
			p.log.Warn("tc: the egress filter of an interface no longer external is not removed", "interface", old.name, "err", err)
			a.outF = old.outF
		}
	}
	p.atts[d.index] = a
	with := "tcx"
	if a.filter != nil {
		with = "clsact"
	}
	p.log.Debug("tc program attached", "interface", d.name, "external", d.ext, "with", with)
	return nil
}

// attachHook attaches prog to hook h of d: with tcx (swapped into old,
// the link there, if any) unless the kernel lacks it, else with a
// cls_bpf filter.
func (p *tcPlane) attachHook(d tcDevice, h tcHook, prog *ebpf.Program, old link.Link) (link.Link, *netlink.BpfFilter, error) {
	if !p.legacy {
		l, err := p.attachTCX(d, h, prog, old)
		switch {
		case err == nil:
			return l, nil, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			p.log.Info("no tcx in this kernel: attaching with clsact and cls_bpf", "kernel", kernelRelease())
			p.legacy = true
		default:
			return nil, nil, fmt.Errorf("ebpf: tc: attach %s to %s %s (tcx): %w", prog, d.name, h.name, err)
		}
	}
	f, err := p.attachFilter(d, h, prog)
	if err != nil {
		return nil, nil, fmt.Errorf("ebpf: tc: attach %s to %s %s (clsact): %w", prog, d.name, h.name, err)
	}
	return nil, f, nil
}

// attachTCX attaches prog to hook h of interface index (in the node's
// namespace, where the kernel resolves the index), or swaps it into the
// existing link old.
func (p *tcPlane) attachTCX(d tcDevice, h tcHook, prog *ebpf.Program, old link.Link) (link.Link, error) {
	if old != nil {
		if err := old.Update(prog); err != nil {
			return nil, err
		}
		return old, nil
	}
	pin := p.linkPin(h.pin, d.name)
	if l, err := adoptLink(pin, d.index, prog, tcxIfindex); l != nil || err != nil {
		return l, err
	}
	var l link.Link
	err := p.ns.Do(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: d.index, Program: prog, Attach: h.tcx})
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := pinLink(l, pin); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// attachFilter adds (or replaces) the cls_bpf filter of prog on the
// clsact hook h of d, adding the clsact qdisc when missing.
func (p *tcPlane) attachFilter(d tcDevice, h tcHook, prog *ebpf.Program) (*netlink.BpfFilter, error) {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: d.index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := p.nl.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		if errors.Is(err, unix.ENOENT) {
			return nil, &proxier.UnsupportedError{Backend: "ebpf", What: "the clsact qdisc (CONFIG_NET_SCH_INGRESS, module sch_ingress)", Err: err}
		}
		return nil, fmt.Errorf("add clsact qdisc: %w", err)
	}
	info, err := prog.Info()
	if err != nil {
		return nil, err
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: d.index,
			Parent:    h.parent,
			Handle:    tcFilterHandle,
			Priority:  tcFilterPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         info.Name,
		DirectAction: true,
	}
	if err := p.nl.FilterReplace(f); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, &proxier.UnsupportedError{Backend: "ebpf", What: "the bpf classifier (CONFIG_NET_CLS_BPF, module cls_bpf)", Err: err}
		}
		return nil, fmt.Errorf("add cls_bpf filter: %w", err)
	}
	return f, nil
}

// delFilter removes filter f of interface dev, which may be gone.
func (p *tcPlane) delFilter(f *netlink.BpfFilter, dev string) error {
	if err := p.nl.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("ebpf: tc: remove filter from %s: %w", dev, err)
	}
	return nil
}

// detachAllLocked removes every attachment of this plane.
func (p *tcPlane) detachAllLocked() error {
	errs := []error{p.releaseXDPLocked(dropLink)}
	for idx, a := range p.atts {
		for _, l := range a.links() {
			errs = append(errs, dropLink(l))
		}
		for _, f := range []*netlink.BpfFilter{a.filter, a.outF} {
			if f != nil {
				errs = append(errs, p.delFilter(f, a.name))
			}
		}
		delete(p.atts, idx)
	}
	return errors.Join(errs...)
}

// cleanup detaches every program of this plane, the links a predecessor
// pinned under PinPath (tc_pin.go), and the cls_bpf filters of the tc
// programs a predecessor left on any interface of the node's namespace
// (unpinned tcx and XDP links die with their process).
func (p *tcPlane) cleanup() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	errs := []error{p.detachAllLocked(), p.unpinAll()}
	links, err := p.nl.LinkList()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("ebpf: tc: list interfaces: %w", err))...)
	}
	for _, l := range links {
		var fs []netlink.Filter
		for _, h := range []tcHook{tcIngress, tcEgress} {
			hf, err := p.nl.FilterList(l, h.parent)
			if err != nil {
				continue // no clsact qdisc
			}
			fs = append(fs, hf...)
		}
		for _, f := range fs {
			bf, ok := f.(*netlink.BpfFilter)
			if ok && strings.HasPrefix(bf.Name, "pk_tc_") && bf.Priority == tcFilterPriority {
				if err := p.nl.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("ebpf: tc: remove filter from %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	if err := batchDel(p.objs.PkIfaddr, slices.Collect(maps.Keys(p.ifaddrs))); err != nil {
		errs = append(errs, fmt.Errorf("ebpf: tc: %w", err))
	}
	clear(p.ifaddrs)
	return errors.Join(errs...)
}

// familyOf returns the family of a 16-byte address as the maps hold it.
func familyOf(a [16]byte) model.IPFamily {
	if netip.AddrFrom16(a).Is4In6() {
		return model.IPv4
	}
	return model.IPv6
}

// setMaglevSize makes the Maglev tables of a north-south object (its
// pk_nsmag rows and ns_maglev_size) m entries long.
func setMaglevSize(spec *ebpf.CollectionSpec, m int) error {
	if err := sizeTableMap(spec.Maps[mapNSMag], m); err != nil {
		return err
	}
	vs, ok := spec.Variables["ns_maglev_size"]
	if !ok {
		return errors.New("ebpf: north-south object lacks variable ns_maglev_size")
	}
	if err := vs.Set(uint32(m)); err != nil {
		return fmt.Errorf("ebpf: ns_maglev_size: %w", err)
	}
	return nil
}
