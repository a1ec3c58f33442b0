package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// NorthSouthXDP serves traffic from outside the node with an XDP
// program (bpf/xdp.c) on the node's external interfaces, in front of
// the tc programs of [NorthSouthTC], which it shares its maps with.
// What XDP can finish (a translated packet that leaves through an
// interface taking XDP frames: out of the one it came in on, the usual
// case of a node with one uplink, or another listed in pk_xdptx) it
// sends without an skb; everything else it passes to tc untranslated.
// An interface whose driver has no native XDP is served by tc alone.
//
// A veth takes XDP frames only when its peer has GRO on or an XDP
// program (a kernel rule the node side cannot see), so XDP sends
// nothing out of a veth (there it passes to tc) unless
// Config.NorthSouthXDPVeth says the peers do.
const NorthSouthXDP NorthSouth = "xdp"

// Map names of bpf/xdp.c's own maps.
const (
	mapXDPTx   = "pk_xdptx"
	mapXDPStat = "pk_xdpstat"
)

// The indices of pk_xdpstat.
const (
	xdpStatTX = iota
	xdpStatRedirect
	xdpStatPass
	xdpStats
)

// xdpPart is the XDP program of a tc plane and where it is attached.
type xdpPart struct {
	objs xdpObjects
	// links are the attachments by interface index.
	links map[int]xdpAttachment
	// tx is what pk_xdptx holds.
	tx map[uint32]bool
	// veth lets XDP send out of veths too (Config.NorthSouthXDPVeth).
	veth bool
}

// xdpAttachment is the XDP program on one interface.
type xdpAttachment struct {
	name string
	link link.Link
}

// loadXDP loads bpf/xdp.c with the maps of the tc programs.
func (p *tcPlane) loadXDP() error {
	spec, err := loadXdp()
	if err != nil {
		return fmt.Errorf("ebpf: xdp: %w", err)
	}
	if err := setSNATPorts(spec, p.snat); err != nil {
		return err
	}
	if err := setMaglevSize(spec, p.cfg.MaglevTableSize); err != nil {
		return err
	}
	shared := map[string]*ebpf.Map{
		mapNSMag:   p.objs.PkNsmag,
		mapNSLoc:   p.objs.PkNsloc,
		mapNSFe:    p.objs.PkNsfe,
		mapNSBe:    p.objs.PkNsbe,
		mapNSCt:    p.objs.PkNsct,
		mapNSRev:   p.objs.PkNsrev,
		mapNSAff:   p.objs.PkNsaff,
		mapNSRange: p.objs.PkNsrange,
		mapIfAddr:  p.objs.PkIfaddr,
		mapNode4:   p.objs.PkNode4,
		mapNode6:   p.objs.PkNode6,
	}
	for name, m := range shared {
		ms := spec.Maps[name]
		if ms == nil {
			return fmt.Errorf("ebpf: xdp: bpf/xdp.c lacks map %s", name)
		}
		ms.MaxEntries = m.MaxEntries()
	}
	for _, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
	}
	x := &xdpPart{links: map[int]xdpAttachment{}, tx: map[uint32]bool{}, veth: p.cfg.NorthSouthXDPVeth}
	if err := spec.LoadAndAssign(&x.objs, &ebpf.CollectionOptions{MapReplacements: shared}); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("ebpf: the XDP program (bpf/xdp.c) on kernel %s: %+v", kernelRelease(), verr)
		}
		return loadError("the XDP program (bpf/xdp.c)", err)
	}
	p.xdp = x
	if p.metrics != nil {
		read := p.xdpCounts
		p.metrics.xdp.read.Store(&read)
	}
	return nil
}

// refreshXDPLocked attaches the XDP program to the external devices
// among devs that lack it, detaches it from those that are gone or no
// longer external, and makes pk_xdptx list the attached devices XDP may
// send out of.
func (p *tcPlane) refreshXDPLocked(devs []tcDevice) error {
	x := p.xdp
	if x == nil {
		return nil
	}
	var errs []error
	want := map[int]tcDevice{}
	for _, d := range devs {
		if d.ext {
			want[d.index] = d
		}
	}
	for idx, a := range x.links {
		if d, ok := want[idx]; !ok || d.name != a.name {
			errs = append(errs, dropLink(a.link))
			delete(x.links, idx)
		}
	}
	tx := map[uint32]bool{}
	for _, idx := range slices.Sorted(maps.Keys(want)) {
		d := want[idx]
		if _, ok := x.links[idx]; !ok {
			l, err := p.attachXDP(d)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if l == nil {
				continue // no native XDP: tc alone serves it
			}
			x.links[idx] = xdpAttachment{name: d.name, link: l}
		}
		if x.veth || !p.isVeth(idx) {
			tx[uint32(idx)] = true
		}
	}
	errs = append(errs, p.writeXDPTx(tx))
	return errors.Join(errs...)
}

// attachXDP attaches the program to d in native (driver) mode. A driver
// without native XDP gives a nil link and no error.
func (p *tcPlane) attachXDP(d tcDevice) (link.Link, error) {
	pin := p.linkPin(xdpLinkPin, d.name)
	if l, err := adoptLink(pin, d.index, p.xdp.objs.PkXdpExt, xdpIfindex); l != nil || err != nil {
		if err != nil {
			return nil, fmt.Errorf("ebpf: xdp: %s: %w", d.name, err)
		}
		return l, nil
	}
	var l link.Link
	err := p.ns.Do(func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: p.xdp.objs.PkXdpExt, Interface: d.index, Flags: link.XDPDriverMode})
		return err
	})
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, ebpf.ErrNotSupported) {
		p.log.Info("no native XDP on this interface: tc serves it", "interface", d.name, "error", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ebpf: xdp: attach to %s: %w", d.name, err)
	}
	if err := pinLink(l, pin); err != nil {
		l.Close()
		return nil, fmt.Errorf("ebpf: xdp: %w", err)
	}
	p.log.Debug("XDP program attached", "interface", d.name)
	return l, nil
}

// isVeth says whether interface index is a veth.
func (p *tcPlane) isVeth(index int) bool {
	l, err := p.nl.LinkByIndex(index)
	return err == nil && l.Type() == "veth"
}

// writeXDPTx makes pk_xdptx hold exactly want.
func (p *tcPlane) writeXDPTx(want map[uint32]bool) error {
	x := p.xdp
	var errs []error
	for idx := range x.tx {
		if !want[idx] {
			if err := x.objs.PkXdptx.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
				continue
			}
			delete(x.tx, idx)
		}
	}
	// The kernel resolves a devmap's interface index in the network
	// namespace of the thread that writes it: the node's.
	err := p.ns.Do(func() error {
		for idx := range want {
			if !x.tx[idx] {
				if err := x.objs.PkXdptx.Put(idx, idx); err != nil {
					errs = append(errs, fmt.Errorf("ebpf: xdp: %s: interface %d: %w", mapXDPTx, idx, err))
					continue
				}
				x.tx[idx] = true
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// releaseXDPLocked lets go of the XDP program's links with release:
// dropLink detaches them, link.Link.Close only closes this process's
// handles of pinned ones (they stay attached).
func (p *tcPlane) releaseXDPLocked(release func(link.Link) error) error {
	x := p.xdp
	if x == nil {
		return nil
	}
	var errs []error
	for idx, a := range x.links {
		errs = append(errs, release(a.link))
		delete(x.links, idx)
	}
	return errors.Join(errs...)
}

// closeXDPLocked closes the XDP program's objects (after
// releaseXDPLocked).
func (p *tcPlane) closeXDPLocked() error {
	x := p.xdp
	if x == nil {
		return nil
	}
	p.xdp = nil
	return x.objs.Close()
}

// xdpCounts returns what the XDP program did with the packets it
// served, summed over CPUs: sent back out (XDP_TX), redirected, and
// passed to tc.
func (p *tcPlane) xdpCounts() (tx, redirect, pass uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.xdp == nil {
		return 0, 0, 0, errors.New("ebpf: no XDP program")
	}
	sum := func(k uint32) (uint64, error) {
		var per []uint64
		if err := p.xdp.objs.PkXdpstat.Lookup(k, &per); err != nil {
			return 0, fmt.Errorf("ebpf: xdp: %s: %w", mapXDPStat, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n, nil
	}
	var errs [xdpStats]error
	tx, errs[0] = sum(xdpStatTX)
	redirect, errs[1] = sum(xdpStatRedirect)
	pass, errs[2] = sum(xdpStatPass)
	return tx, redirect, pass, errors.Join(errs[:]...)
}
