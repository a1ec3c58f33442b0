package changetracker

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
)

var (
	errZone        = errors.New("address has a zone")
	errUnspecified = errors.New("unspecified address")
	errLoopback    = errors.New("may not be in the loopback range (127.0.0.0/8, ::1/128)")
	errLinkLocal   = errors.New("may not be a link-local address (169.254.0.0/16, fe80::/10)")
	errMulticast   = errors.New("may not be a multicast or broadcast address")
)

// broadcast is the IPv4 limited broadcast address.
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// parseAddr parses an address as the API server stores it. Like
// Kubernetes' own sloppy parser, it accepts IPv4 octets with leading zeros
// (read as decimal), which old clusters may still hold. The result is
// unmapped. It refuses what must never be programmed as a service or
// endpoint address, as the API's validation of endpoints and external
// IPs does: zoned, unspecified, loopback, link-local, multicast and
// broadcast addresses (a cluster IP of 127.0.0.1 would capture the
// node's own 127.0.0.1 servers).
func parseAddr(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		legacy, ok := parseLegacyIPv4(s)
		if !ok {
			return netip.Addr{}, err
		}
		a = legacy
	}
	if a.Zone() != "" {
		return netip.Addr{}, errZone
	}
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return netip.Addr{}, errUnspecified
	case a.IsLoopback():
		return netip.Addr{}, errLoopback
	case a.IsLinkLocalUnicast():
		return netip.Addr{}, errLinkLocal
	case a.IsMulticast() || a == broadcast:
		return netip.Addr{}, errMulticast
	}
	return a, nil
}

// parseLegacyIPv4 parses a dotted quad whose octets may have leading zeros.
func parseLegacyIPv4(s string) (netip.Addr, bool) {
	var b [4]byte
	for i := range b {
		part, rest, found := strings.Cut(s, ".")
		if found == (i == 3) || part == "" || len(part) > 3 {
			return netip.Addr{}, false
		}
		n, err := strconv.ParseUint(part, 10, 8)
		if err != nil {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
		s = rest
	}
	return netip.AddrFrom4(b), true
}

// parsePrefix parses a CIDR, sloppily like parseAddr, and masks it.
func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, errors.New("missing prefix length")
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		legacy, ok := parseLegacyIPv4(addr)
		if !ok {
			return netip.Prefix{}, err
		}
		a = legacy
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errZone
	}
	if a.Is4In6() {
		return netip.Prefix{}, errors.New("IPv4-mapped IPv6 prefix")
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 0 || n > a.BitLen() {
		return netip.Prefix{}, errors.New("bad prefix length")
	}
	return netip.PrefixFrom(a, n).Masked(), nil
}

// guessFamily returns the family a string that does not parse was probably
// meant to be in: the declared family when there is one, else IPv6 when it
// contains a colon.
func guessFamily(s string, declared v1.IPFamily) model.IPFamily {
	switch declared {
	case v1.IPv4Protocol:
		return model.IPv4
	case v1.IPv6Protocol:
		return model.IPv6
	}
	if strings.Contains(s, ":") {
		return model.IPv6
	}
	return model.IPv4
}

// validPort converts an API port number, reporting whether it is in
// 1..65535.
func validPort(p int32) (uint16, bool) {
	if p < 1 || p > 65535 {
		return 0, false
	}
	return uint16(p), true
}

// protocol converts an API protocol; empty means TCP, as API defaulting
// would have made it.
func protocol(p v1.Protocol) (model.Protocol, bool) {
	if p == "" {
		return model.TCP, true
	}
	mp := model.Protocol(p)
	return mp, mp.Valid()
}

var errWrongFamily = errors.New("address of the other family")
