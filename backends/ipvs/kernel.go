package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"

	mipvs "github.com/moby/ipvs"

	"github.com/proxykit/proxykit/model"
)

// IPVS flags and address families, as in linux/ip_vs.h.
const (
	svcFlagPersistent = 0x0001
	familyIPv4        = syscall.AF_INET
	familyIPv6        = syscall.AF_INET6
)

// ipvsTable wraps a moby/ipvs handle in the backend's terms.
type ipvsTable struct {
	h   *mipvs.Handle
	fam model.IPFamily
}

func ipvsProto(p model.Protocol) uint16 { return uint16(p.Number()) }

func (t *ipvsTable) afi() uint16 {
	if t.fam == model.IPv6 {
		return familyIPv6
	}
	return familyIPv4
}

// service returns the moby form of a virtual server.
func (t *ipvsTable) service(s *vsSpec) *mipvs.Service {
	svc := &mipvs.Service{
		Address:       net.IP(s.Key.Addr.AsSlice()),
		Protocol:      ipvsProto(s.Key.Proto),
		Port:          s.Key.Port,
		SchedName:     s.Sched,
		AddressFamily: t.afi(),
		Netmask:       0xffffffff,
	}
	if t.fam == model.IPv6 {
		svc.Netmask = 128
	}
	if s.Timeout > 0 {
		svc.Flags |= svcFlagPersistent
		svc.Timeout = s.Timeout
	}
	return svc
}

// keyService returns a service that names a virtual server for lookups
// and deletion.
func (t *ipvsTable) keyService(k vsKey) *mipvs.Service {
	return t.service(&vsSpec{Key: k, Sched: DefaultScheduler})
}

func (t *ipvsTable) dest(d netip.AddrPort, weight int) *mipvs.Destination {
	return &mipvs.Destination{
		Address:         net.IP(d.Addr().AsSlice()),
		Port:            d.Port(),
		Weight:          weight,
		ConnectionFlags: mipvs.ConnectionFlagMasq,
		AddressFamily:   t.afi(),
	}
}

// kernelVS is a virtual server as the kernel holds it.
type kernelVS struct {
	Key     vsKey
	Sched   string
	Timeout uint32 // 0 when not persistent
}

// kernelDest is a real server as the kernel holds it.
type kernelDest struct {
	Addr   netip.AddrPort
	Weight int
	// Conns counts active and inactive connections.
	Conns int
}

// list returns the virtual servers of the table's family (address-based
// ones; firewall-mark services are never the backend's).
func (t *ipvsTable) list() ([]kernelVS, error) {
	svcs, err := dumpServices(t.h)
	if err != nil {
		return nil, err
	}
	var out []kernelVS
	for _, s := range svcs {
		if s.FWMark != 0 || s.AddressFamily != t.afi() {
			continue
		}
		a, ok := netip.AddrFromSlice(s.Address)
		p, known := model.ProtocolOfNumber(byte(s.Protocol))
		if !ok || !known {
			continue
		}
		k := kernelVS{Key: vsKey{Addr: a.Unmap(), Proto: p, Port: s.Port}, Sched: s.SchedName}
		if s.Flags&svcFlagPersistent != 0 {
			k.Timeout = s.Timeout
		}
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b kernelVS) int { return compareKeys(a.Key, b.Key) })
	return out, nil
}

// maxServiceDumps bounds the dumps dumpServices reads.
const maxServiceDumps = 8

// serviceID identifies a virtual server in a dump.
type serviceID struct {
	fwmark, family, proto, port uint32
	addr                        netip.Addr
}

// dumpServices lists the namespace's virtual servers. The kernel keeps
// the virtual servers of every network namespace in one hash table and
// resumes a dump that spans several messages at a position counted over
// all namespaces' entries, so a virtual server added or removed in
// another namespace between two parts of the dump shifts the position:
// entries of this namespace are then skipped (or repeated). Nothing
// flags such a dump, so it is read again until one dump holds exactly
// what all dumps together found (at most maxServiceDumps reads), and the
// union is returned. The union is exact for the proxier's own namespace,
// which nobody else writes while the proxier reads it.
func dumpServices(h *mipvs.Handle) ([]*mipvs.Service, error) {
	seen := map[serviceID]bool{}
	var out []*mipvs.Service
	for i := range maxServiceDumps {
		svcs, err := h.GetServices()
		if err != nil {
			return nil, fmt.Errorf("list IPVS services: %w", err)
		}
		added, distinct := 0, map[serviceID]bool{}
		for _, s := range svcs {
			a, _ := netip.AddrFromSlice(s.Address)
			id := serviceID{s.FWMark, uint32(s.AddressFamily), uint32(s.Protocol), uint32(s.Port), a.Unmap()}
			distinct[id] = true
			if !seen[id] {
				seen[id] = true
				out = append(out, s)
				added++
			}
		}
		// A dump that found nothing new and everything known.
		if i > 0 && added == 0 && len(distinct) == len(seen) {
			break
		}
	}
	return out, nil
}

// dests returns the real servers of a virtual server.
func (t *ipvsTable) dests(k vsKey) ([]kernelDest, error) {
	ds, err := t.h.GetDestinations(t.keyService(k))
	if err != nil {
		return nil, fmt.Errorf("list real servers of %s: %w", k, err)
	}
	out := make([]kernelDest, 0, len(ds))
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		out = append(out, kernelDest{
			Addr:   netip.AddrPortFrom(a.Unmap(), d.Port),
			Weight: d.Weight,
			Conns:  d.ActiveConnections + d.InactiveConnections,
		})
	}
	return out, nil
}

func (t *ipvsTable) create(s *vsSpec) error {
	if err := t.h.NewService(t.service(s)); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("create virtual server %s (scheduler %s): %w", s.Key, s.Sched, err)
	}
	return nil
}

func (t *ipvsTable) update(s *vsSpec) error {
	if err := t.h.UpdateService(t.service(s)); err != nil {
		return fmt.Errorf("update virtual server %s: %w", s.Key, err)
	}
	return nil
}

func (t *ipvsTable) remove(k vsKey) error {
	if err := t.h.DelService(t.keyService(k)); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete virtual server %s: %w", k, err)
	}
	return nil
}

func (t *ipvsTable) addDest(k vsKey, d netip.AddrPort) error {
	err := t.h.NewDestination(t.keyService(k), t.dest(d, 1))
	if errors.Is(err, syscall.EEXIST) {
		err = t.h.UpdateDestination(t.keyService(k), t.dest(d, 1))
	}
	if err != nil {
		return fmt.Errorf("add real server %s to %s: %w", d, k, err)
	}
	return nil
}

func (t *ipvsTable) setWeight(k vsKey, d netip.AddrPort, w int) error {
	if err := t.h.UpdateDestination(t.keyService(k), t.dest(d, w)); err != nil {
		return fmt.Errorf("set weight of real server %s of %s: %w", d, k, err)
	}
	return nil
}

func (t *ipvsTable) delDest(k vsKey, d netip.AddrPort) error {
	err := t.h.DelDestination(t.keyService(k), t.dest(d, 0))
	if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("delete real server %s of %s: %w", d, k, err)
	}
	return nil
}
