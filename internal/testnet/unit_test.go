package testnet

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

func TestCRC32c(t *testing.T) {
	// RFC 3720, B.4: 32 bytes of zeros.
	if got := crc32.Checksum(make([]byte, 32), castagnoli); got != 0x8a9136aa {
		t.Fatalf("crc32c(32 zeros) = %#x, want 0x8a9136aa", got)
	}
	// The checksum field does not take part.
	b := buildSCTPInit(1, 2, 3)
	c := sctpChecksum(b)
	b[8], b[9] = 0xff, 0xff
	if sctpChecksum(b) != c {
		t.Error("checksum depends on the checksum field")
	}
}

func TestSCTPInitRoundTrip(t *testing.T) {
	b := buildSCTPInit(40000, 8080, 0xdeadbeef)
	if len(b) != 32 {
		t.Fatalf("INIT packet is %d bytes, want 32", len(b))
	}
	got, ok := parseSCTPInit(b)
	if !ok || got != (sctpInit{srcPort: 40000, dstPort: 8080, tag: 0xdeadbeef}) {
		t.Fatalf("parse = %+v, %v", got, ok)
	}
	// NAT rewrites ports and the checksum; a wrong checksum is rejected.
	binary.BigEndian.PutUint16(b[2:], 9090)
	if _, ok := parseSCTPInit(b); ok {
		t.Error("accepted a packet with a stale checksum")
	}
	binary.LittleEndian.PutUint32(b[8:], sctpChecksum(b))
	if got, ok := parseSCTPInit(b); !ok || got.dstPort != 9090 {
		t.Errorf("parse after rewrite = %+v, %v", got, ok)
	}
	b[12] = 2 // INIT ACK
	binary.LittleEndian.PutUint32(b[8:], sctpChecksum(b))
	if _, ok := parseSCTPInit(b); ok {
		t.Error("accepted a chunk that is not INIT")
	}
	if _, ok := parseSCTPInit(b[:20]); ok {
		t.Error("accepted a short packet")
	}
}

func TestReplyRoundTrip(t *testing.T) {
	for _, s := range []string{
		"node1-pod1 tcp 8080 10.244.1.3:41234",
		"node2-pod2 udp 8081 [fd00:10:244:1::3]:5353 ab12-3",
	} {
		r, err := ParseReply(s + "\n")
		if err != nil {
			t.Fatal(err)
		}
		if r.String() != s {
			t.Errorf("round trip %q -> %q", s, r.String())
		}
	}
	for _, s := range []string{"", "a b c", "a tcp x 1.2.3.4:5", "a tcp 1 1.2.3.4"} {
		if _, err := ParseReply(s); err == nil {
			t.Errorf("ParseReply(%q) succeeded", s)
		}
	}
}

func TestMandatory(t *testing.T) {
	for _, x := range []struct {
		ci, req string
		want    bool
	}{{"", "", false}, {"true", "", true}, {"false", "", false}, {"", "1", true}, {"", "0", false}} {
		t.Setenv(EnvCI, x.ci)
		t.Setenv(EnvRequirePrivileged, x.req)
		if got := Mandatory(); got != x.want {
			t.Errorf("CI=%q %s=%q: Mandatory() = %v", x.ci, EnvRequirePrivileged, x.req, got)
		}
	}
}
