package ebpf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// With Config.PinPath the tc plane outlives its process as the socket
// programs do: its maps (frontends, endpoint slots, the flows and their
// reverse translations, affinity, source ranges, interface addresses)
// are pinned and adopted by the next proxier, whose first sync reads
// them back; its tcx and XDP links are pinned per interface (clsact
// filters stay by themselves), so the programs keep serving while no
// proxier runs and the next one swaps its programs in without a gap.
// Close then detaches nothing; Cleanup removes every pin.

// tcPinnedMaps are the tc plane's maps pinned under PinPath.
func tcPinnedMaps() []string {
	return []string{mapNSFe, mapNSBe, mapNSCt, mapNSRev, mapNSAff, mapNSRange, mapNSLoc, mapNSMag, mapIfAddr}
}

// Prefixes of the pinned links' file names under PinPath, followed by
// the interface's name.
const (
	tcxLinkPin    = "pk_tcx_"
	tcxOutLinkPin = "pk_tcxout_"
	xdpLinkPin    = "pk_xdp_"
)

// pinMapsSpec makes spec pin the tc plane's maps under PinPath: a
// pinned map of a predecessor is adopted with its contents, unless its
// layout or size no longer matches the configuration (then the pin is
// replaced and its contents are lost, with a warning).
func (p *tcPlane) pinMapsSpec(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) error {
	if p.cfg.PinPath == "" {
		return nil
	}
	for _, name := range tcPinnedMaps() {
		ms := spec.Maps[name]
		ms.Pinning = ebpf.PinByName
		path := filepath.Join(p.cfg.PinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ebpf: tc: pinned map %s: %w", path, err)
		}
		cerr := ms.Compatible(m)
		m.Close()
		if cerr != nil {
			p.log.Warn("pinned map does not match the configuration; it is replaced and its contents are lost", "map", path, "err", cerr)
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("ebpf: tc: replace pinned map: %w", err)
			}
		}
	}
	opts.Maps.PinPath = p.cfg.PinPath
	return nil
}

// linkPin returns where the link of the given prefix (tcxLinkPin,
// tcxOutLinkPin, xdpLinkPin) on interface dev is pinned, or "" without PinPath.
func (p *tcPlane) linkPin(prefix, dev string) string {
	if p.cfg.PinPath == "" {
		return ""
	}
	return filepath.Join(p.cfg.PinPath, prefix+dev)
}

// adoptLink loads the link pinned at pin and swaps prog into it when it
// is still attached to interface index: a predecessor's attachment,
// kept without a gap. A pinned link of a gone interface (its index
// differs or is 0) is unpinned. It returns nil when there is nothing to
// adopt.
func adoptLink(pin string, index int, prog *ebpf.Program, ifindex func(link.Info) uint32) (link.Link, error) {
	if pin == "" {
		return nil, nil
	}
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	info, err := l.Info()
	if err != nil || ifindex(*info) != uint32(index) {
		return nil, errors.Join(l.Unpin(), l.Close())
	}
	if err := l.Update(prog); err != nil {
		l.Close()
		return nil, fmt.Errorf("swap the program into pinned link %s: %w", pin, err)
	}
	return l, nil
}

// tcxIfindex and xdpIfindex are the interface a link's info names (0
// for another kind of link, or a detached one).
func tcxIfindex(i link.Info) uint32 {
	if x := i.TCX(); x != nil {
		return x.Ifindex
	}
	return 0
}

func xdpIfindex(i link.Info) uint32 {
	if x := i.XDP(); x != nil {
		return x.Ifindex
	}
	return 0
}

// pinLink pins l at pin (nothing without PinPath).
func pinLink(l link.Link, pin string) error {
	if pin == "" {
		return nil
	}
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// dropLink detaches l: unpinned first (nothing when it is not pinned),
// so that closing it detaches.
func dropLink(l link.Link) error {
	return errors.Join(l.Unpin(), l.Close())
}

// unpinAll detaches the links pinned under PinPath that this plane
// does not hold (a predecessor's, for interfaces it never attached)
// and removes the tc plane's map pins. Only Cleanup calls it.
func (p *tcPlane) unpinAll() error {
	if p.cfg.PinPath == "" {
		return nil
	}
	entries, err := os.ReadDir(p.cfg.PinPath)
	if err != nil {
		return fmt.Errorf("ebpf: tc: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tcxLinkPin) && !strings.HasPrefix(e.Name(), tcxOutLinkPin) && !strings.HasPrefix(e.Name(), xdpLinkPin) {
			continue
		}
		path := filepath.Join(p.cfg.PinPath, e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("ebpf: tc: load pinned link %s: %w", path, err))
			continue
		}
		errs = append(errs, dropLink(l))
	}
	for _, name := range tcPinnedMaps() {
		if err := os.Remove(filepath.Join(p.cfg.PinPath, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ebpf: tc: unpin map %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
