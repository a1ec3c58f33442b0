package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	mobyipvs "github.com/moby/ipvs"

	"github.com/proxykit/proxykit/backends/ipvs"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/sandbox"
)

// showIPVS prints the IPVS virtual servers in the node's namespace and
// their real servers, as the kernel reports them.
func showIPVS(ctx context.Context, w io.Writer, node *sandbox.Node, name func(netip.Addr) string) error {
	h, err := mobyipvs.New(node.NetNSPath())
	if err != nil {
		return err
	}
	defer h.Close()
	svcs, err := h.GetServices()
	if err != nil {
		return err
	}
	type line struct {
		addr netip.AddrPort
		text string
	}
	var lines []line
	for _, s := range svcs {
		a, _ := netip.AddrFromSlice(s.Address)
		ap := netip.AddrPortFrom(a.Unmap(), s.Port)
		proto, ok := model.ProtocolOfNumber(uint8(s.Protocol))
		if !ok {
			proto = model.Protocol(fmt.Sprint(s.Protocol))
		}
		head := fmt.Sprintf("%-4s %-22s %-3s", strings.ToLower(string(proto)), ap, s.SchedName)
		if s.Flags&0x1 != 0 { // IP_VS_SVC_F_PERSISTENT
			head += fmt.Sprintf(" persistent %ds", s.Timeout)
		}
		dests, err := h.GetDestinations(s)
		if err != nil {
			return err
		}
		var ds []string
		for _, d := range dests {
			da, _ := netip.AddrFromSlice(d.Address)
			ds = append(ds, fmt.Sprintf("%s:%d", name(da.Unmap()), d.Port))
		}
		slices.Sort(ds)
		tail := "no real server: rejected by the backend's rules"
		if len(ds) > 0 {
			tail = strings.Join(ds, ", ")
		}
		lines = append(lines, line{ap, head + " → " + tail})
	}
	slices.SortFunc(lines, func(a, b line) int {
		if c := a.addr.Addr().Compare(b.addr.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.addr.Port(), b.addr.Port())
	})
	fmt.Fprintf(w, "\nWhat ipvs programmed in node1 (IPVS virtual servers, read back over netlink; service addresses on %s):\n", ipvs.DefaultInterfaceName)
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l.text)
	}
	return nil
}
