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
