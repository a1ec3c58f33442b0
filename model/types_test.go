package model

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestProtocolNumbers(t *testing.T) {
	for p, n := range map[Protocol]uint8{TCP: unix.IPPROTO_TCP, UDP: unix.IPPROTO_UDP, SCTP: unix.IPPROTO_SCTP} {
		if got := p.Number(); got != n {
			t.Errorf("%s.Number() = %d, want %d", p, got, n)
		}
		if got, ok := ProtocolOfNumber(n); !ok || got != p {
			t.Errorf("ProtocolOfNumber(%d) = %q, %v; want %s", n, got, ok, p)
		}
	}
	if n := Protocol("ICMP").Number(); n != 0 {
		t.Errorf("ICMP.Number() = %d, want 0", n)
	}
	if p, ok := ProtocolOfNumber(unix.IPPROTO_ICMP); ok {
		t.Errorf("ProtocolOfNumber(ICMP) = %q, true", p)
	}
}

func TestServicePortNameCompare(t *testing.T) {
	n := func(ns, name, port string, p Protocol) ServicePortName {
		return ServicePortName{ServiceName: ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: p}
	}
	sorted := []ServicePortName{
		n("a", "z", "", TCP), n("b", "a", "", TCP), n("b", "a", "http", SCTP),
		n("b", "a", "http", TCP), n("b", "a", "http", UDP), n("b", "b", "", TCP),
	}
	for i, x := range sorted {
		if x.Compare(x) != 0 {
			t.Errorf("%v differs from itself", x)
		}
		for _, y := range sorted[i+1:] {
			if x.Compare(y) != -1 || y.Compare(x) != 1 {
				t.Errorf("%v and %v compare %d / %d, want -1 / 1", x, y, x.Compare(y), y.Compare(x))
			}
		}
	}
}

func TestDistinctAddrs(t *testing.T) {
	ep := func(s string) *Endpoint { return &Endpoint{Addr: netip.MustParseAddrPort(s)} }
	eps := []*Endpoint{ep("10.0.0.2:80"), ep("[::ffff:10.0.0.1]:80"), ep("10.0.0.2:80"), ep("10.0.0.1:80"), ep("10.0.0.1:0"), ep("[fd00::1]:80"), nil}
	got := DistinctAddrs(eps, IPv4.Usable)
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:80"), netip.MustParseAddrPort("10.0.0.1:80")}
	if !slices.Equal(got, want) {
		t.Errorf("IPv4 usable: %v, want %v", got, want)
	}
	// Beyond the linear search: the same answer through the map.
	var many []*Endpoint
	for i := range 40 {
		many = append(many, ep(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(i % 20)}), 80).String()))
	}
	if got := DistinctAddrs(many, nil); len(got) != 20 || got[0] != many[0].Addr || got[19] != many[19].Addr {
		t.Errorf("40 endpoints, 20 distinct: got %d: %v", len(got), got)
	}
}

// BenchmarkServicePortNameSort sorts 100,000 service port names (of 100
// namespaces, as the scale benchmarks name them), as a full sync does.
func BenchmarkServicePortNameSort(b *testing.B) {
	names := make([]ServicePortName, 100_000)
	for i := range names {
		names[i] = ServicePortName{ServiceName: ServiceName{Namespace: fmt.Sprintf("ns-%d", i%100), Name: fmt.Sprintf("svc-%d", i)},
			Port: "http", Protocol: TCP}
	}
	work := make([]ServicePortName, len(names))
	for b.Loop() {
		copy(work, names)
		slices.SortFunc(work, ServicePortName.Compare)
	}
}
