package ebpf

import (
	"cmp"
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

// frontends decodes the frontends of st. A frontend's short circuit
// (the entry of its key with Pad nsfeKeyShort) is folded into it: the
// endpoints that only pods reach are its SomeSources.
func (st *nsState) frontends() []proxier.Frontend {
	out := make([]proxier.Frontend, 0, len(st.fes))
	for k, v := range st.fes {
		proto, ok := model.ProtocolOfNumber(k.Proto)
		if !ok || k.Pad != 0 {
			continue
		}
		f := proxier.Frontend{Protocol: proto, Port: port16(k.Port), Affinity: v.AffinitySec > 0}
		if a := netip.AddrFrom16(k.Addr).Unmap(); !a.IsUnspecified() {
			f.Addr = a
		}
		var missing int
		f.Endpoints, missing = st.endpoints(v)
		f.Verdict = v.verdict()
		short := k
		short.Pad = nsfeKeyShort
		sv, hasShort := st.fes[short]
		if hasShort {
			eps, m := st.endpoints(sv)
			missing += m
			f.Endpoints, f.SomeSources = proxier.SplitEndpoints(f.Endpoints, eps)
			slices.SortFunc(f.SomeSources, netip.AddrPort.Compare)
			// A verdict of either part meets some sources.
			f.Verdict = cmp.Or(f.Verdict, sv.verdict())
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
		if hasShort {
			f.Detail += fmt.Sprintf(", pods by the short circuit: group %#x, %d slots", sv.ID, sv.Count)
		}
		if missing > 0 {
			f.Detail += fmt.Sprintf(", %d slots missing", missing)
		}
		out = append(out, f)
	}
	return out
}

// endpoints returns the distinct endpoints of v's slots, sorted, and
// how many of its slots the maps lack.
func (st *nsState) endpoints(v nsfeVal) (eps []netip.AddrPort, missing int) {
	for s := range v.Count {
		be, ok := st.slot(v.ID, s)
		if !ok {
			missing++
			continue
		}
		eps = append(eps, netip.AddrPortFrom(netip.AddrFrom16(be.Addr).Unmap(), port16(be.Port)))
	}
	slices.SortFunc(eps, netip.AddrPort.Compare)
	return slices.Compact(eps), missing
}

// verdict is what a frontend of v does to new connections when it has
// no endpoint: "drop", "reject", or "" when it has some.
func (v nsfeVal) verdict() string {
	switch {
	case v.Count == 0 && v.Flags&nsfeDrop != 0:
		return "drop"
	case v.Count == 0:
		return "reject"
	}
	return ""
}
