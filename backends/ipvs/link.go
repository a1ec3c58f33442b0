package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

// links manages the dummy interface that holds the service addresses,
// and reads the node's own addresses.
type links struct {
	h    *netlink.Handle
	name string
}

// retryDump retries a netlink dump the kernel interrupted (a concurrent
// change); the result of an interrupted dump may be incomplete.
func retryDump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 5 {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// find returns the dummy interface, or nil when it does not exist.
func (l *links) find() (netlink.Link, error) {
	link, err := l.h.LinkByName(l.name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("find interface %s: %w", l.name, err)
	}
	if link.Type() != "dummy" {
		return nil, fmt.Errorf("interface %s exists and is a %s, not a dummy", l.name, link.Type())
	}
	return link, nil
}

// ensure returns the dummy interface, creating it (down: a dummy needs
// not be up for its addresses to be local, and staying down keeps the
// kernel from adding routes and IPv6 link-local addresses to it).
func (l *links) ensure() (netlink.Link, error) {
	link, err := l.find()
	if err != nil || link != nil {
		return link, err
	}
	d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: l.name}}
	if err := l.h.LinkAdd(d); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create dummy interface %s: %w", l.name, err)
	}
	return l.find()
}

// addrs returns the addresses of family f on the dummy interface.
func (l *links) addrs(link netlink.Link, f model.IPFamily) ([]netip.Addr, error) {
	list, err := retryDump(func() ([]netlink.Addr, error) { return l.h.AddrList(link, nlFamily(f)) })
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", l.name, err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func hostPrefix(a netip.Addr) *net.IPNet {
	bits := 32
	if a.Is6() && !a.Is4In6() {
		bits = 128
	}
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}
}

// bind adds a service address to the dummy interface: a host address,
// without duplicate address detection or a prefix route.
func (l *links) bind(link netlink.Link, a netip.Addr) error {
	na := &netlink.Addr{IPNet: hostPrefix(a), Flags: unix.IFA_F_NOPREFIXROUTE}
	if a.Is6() {
		na.Flags |= unix.IFA_F_NODAD
	}
	if err := l.h.AddrAdd(link, na); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", a, l.name, err)
	}
	return nil
}

// unbind removes a service address from the dummy interface.
func (l *links) unbind(link netlink.Link, a netip.Addr) error {
	if err := l.h.AddrDel(link, &netlink.Addr{IPNet: hostPrefix(a)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s from %s: %w", a, l.name, err)
	}
	return nil
}

// nodeAddrs returns the node's own addresses of family f that node ports
// open on: every address of the namespace but loopback, IPv6 link-local
// and those of the dummy interface, narrowed to prefixes when given.
func (l *links) nodeAddrs(f model.IPFamily, prefixes []netip.Prefix) ([]netip.Addr, error) {
	dummy := -1
	if link, err := l.find(); err == nil && link != nil {
		dummy = link.Attrs().Index
	}
	list, err := retryDump(func() ([]netlink.Addr, error) { return l.h.AddrList(nil, nlFamily(f)) })
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.LinkIndex == dummy {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || !f.Contains(ip) {
			continue
		}
		if len(prefixes) > 0 && !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// remove deletes the dummy interface if it exists.
func (l *links) remove() error {
	link, err := l.find()
	if err != nil || link == nil {
		return err
	}
	if err := l.h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete interface %s: %w", l.name, err)
	}
	return nil
}

func nlFamily(f model.IPFamily) int {
	if f == model.IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}
