package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
)

func flow(proto uint8, src, dst, replySrc string, state uint8) *netlink.ConntrackFlow {
	s, d, r := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
	f := &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.IP(s.Addr().AsSlice()), SrcPort: s.Port(), DstIP: net.IP(d.Addr().AsSlice()), DstPort: d.Port()},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.IP(r.Addr().AsSlice()), SrcPort: r.Port(), DstIP: net.IP(s.Addr().AsSlice()), DstPort: s.Port()},
	}
	if proto == unix.IPPROTO_TCP {
		f.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
	}
	return f
}

func TestStale(t *testing.T) {
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	tcpVIP := netip.MustParseAddrPort("10.96.0.20:80")
	valid := Valid{}
	valid.Add(Frontend{Addr: vip, Protocol: model.UDP}, netip.MustParseAddrPort("10.1.0.5:5353"))
	valid.Add(Frontend{Addr: tcpVIP, Protocol: model.TCP}, netip.AddrPort{})
	np := Frontend{Addr: netip.AddrPortFrom(netip.Addr{}, 30053), Protocol: model.UDP}
	valid.Add(np, netip.MustParseAddrPort("10.1.0.5:5353"))
	nodePorts := map[Frontend]bool{np: true}

	const established, synSent, synSent2, timeWait = 3, 1, 9, 7
	cases := []struct {
		name string
		f    *netlink.ConntrackFlow
		want bool
	}{
		{"udp to valid endpoint", flow(unix.IPPROTO_UDP, "10.1.0.9:4000", "10.96.0.10:53", "10.1.0.5:5353", 0), false},
		{"udp to gone endpoint", flow(unix.IPPROTO_UDP, "10.1.0.9:4000", "10.96.0.10:53", "10.1.0.6:5353", 0), true},
		{"udp untranslated to service", flow(unix.IPPROTO_UDP, "10.1.0.9:4000", "10.96.0.10:53", "10.96.0.10:53", 0), true},
		{"udp to other address", flow(unix.IPPROTO_UDP, "10.1.0.9:4000", "10.96.0.11:53", "10.1.0.6:5353", 0), false},
		{"udp node port to gone endpoint", flow(unix.IPPROTO_UDP, "192.0.2.1:4000", "192.0.2.10:30053", "10.1.0.6:5353", 0), true},
		{"udp node port untranslated", flow(unix.IPPROTO_UDP, "192.0.2.1:4000", "192.0.2.10:30053", "192.0.2.10:30053", 0), false},
		{"tcp untranslated syn to new address", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:80", "10.96.0.20:80", synSent), true},
		{"tcp untranslated syn_sent2", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:80", "10.96.0.20:80", synSent2), true},
		{"tcp untranslated established", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:80", "10.96.0.20:80", established), false},
		{"tcp untranslated time_wait", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:80", "10.96.0.20:80", timeWait), false},
		{"tcp translated syn", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:80", "10.1.0.5:8080", synSent), false},
		{"tcp other port", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.20:81", "10.96.0.20:81", synSent), false},
		{"tcp to udp frontend", flow(unix.IPPROTO_TCP, "10.1.0.9:4000", "10.96.0.10:53", "10.96.0.10:53", synSent), false},
		{"icmp ignored", flow(unix.IPPROTO_ICMP, "10.1.0.9:0", "10.96.0.10:53", "10.96.0.10:53", 0), false},
	}
	for _, c := range cases {
		if got := Stale(c.f, valid, nodePorts); got != c.want {
			t.Errorf("%s: Stale = %v, want %v", c.name, got, c.want)
		}
	}
}
