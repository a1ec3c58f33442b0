package model

import (
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
