package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

var _ proxier.Inspector = (*tcBackend)(nil)

// Inspect implements [proxier.Inspector] for the tc part: it reads the
// family's frontends and endpoint slots back from pk_nsfe and pk_nsbe.
// A node port reads as the zero address (every node address in
// pk_node4/6). A frontend without endpoints reads as "reject" (ICMP
// port unreachable), or "drop" when the service has endpoints elsewhere
// (externalTrafficPolicy Local).
func (t *tcBackend) Inspect(ctx context.Context) ([]proxier.Frontend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.plane == nil {
		return nil, errClosed
	}
	st, err := t.readKernel()
	if err != nil {
		return nil, err
	}
	return st.frontends(), nil
}

// sourceRanges returns the source ranges of group id.
func (st *nsState) sourceRanges(id uint32) []netip.Prefix {
	var out []netip.Prefix
	for k := range st.ranges {
		if k.ID != id {
			continue
		}
		a := netip.AddrFrom16(k.Addr)
		bits := int(k.Prefixlen) - 32
		if a.Is4In6() {
			a, bits = a.Unmap(), bits-96
		}
		out = append(out, netip.PrefixFrom(a, bits))
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// frontends decodes the frontends of st.
func (st *nsState) frontends() []proxier.Frontend {
	out := make([]proxier.Frontend, 0, len(st.fes))
	for k, v := range st.fes {
		proto, ok := model.ProtocolOfNumber(k.Proto)
		if !ok {
			continue
		}
		f := proxier.Frontend{Protocol: proto, Port: port16(k.Port), Affinity: v.AffinitySec > 0}
		if a := netip.AddrFrom16(k.Addr).Unmap(); !a.IsUnspecified() {
			f.Addr = a
		}
		missing := 0
		for s := range v.Count {
			be, ok := st.slot(v.ID, s)
			if !ok {
				missing++
				continue
			}
			f.Endpoints = append(f.Endpoints, netip.AddrPortFrom(netip.AddrFrom16(be.Addr).Unmap(), port16(be.Port)))
		}
		slices.SortFunc(f.Endpoints, netip.AddrPort.Compare)
		f.Endpoints = slices.Compact(f.Endpoints)
		switch {
		case v.Count == 0 && v.Flags&nsfeDrop != 0:
			f.Verdict = "drop"
		case v.Count == 0:
			f.Verdict = "reject"
		}
		pick := "random"
		if v.Flags&nsfeMaglev != 0 {
			pick = "maglev (" + mapNSMag + ")"
		}
		f.Detail = fmt.Sprintf("%s group %#x, %d slots, %s", mapNSFe, v.ID, v.Count, pick)
		if v.Flags&nsfeLocal != 0 {
			f.Detail += ", externalTrafficPolicy Local (no SNAT)"
		}
		if v.Flags&nsfeDSR != 0 {
			f.Detail += ", direct server return to remote endpoints (no SNAT)"
		}
		if v.AffinitySec > 0 {
			f.Detail += fmt.Sprintf(", affinity %ds", v.AffinitySec)
		}
		if v.Flags&nsfeRanges != 0 {
			f.SourceRanges = st.sourceRanges(v.ID)
			if f.SourceRanges == nil {
				f.SourceRanges = []netip.Prefix{}
			}
			f.Detail += fmt.Sprintf(", source ranges in %s", mapNSRange)
		}
		if missing > 0 {
			f.Detail += fmt.Sprintf(", %d slots missing", missing)
		}
		out = append(out, f)
	}
	return out
}
