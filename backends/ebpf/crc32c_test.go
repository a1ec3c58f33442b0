package ebpf

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// crc32cPoly is CRC32c's polynomial, bit-reversed (bit 31 is x^0).
const crc32cPoly = 0x82f63b78

// crc32cMul is bpf/nodeport.h's crc32c_mul: a * b modulo the polynomial.
func crc32cMul(a, b uint32) uint32 {
	var p uint32
	for i := range 32 {
		if a>>(31-i)&1 != 0 {
			p ^= b
		}
		b = b>>1 ^ crc32cPoly&-(b&1)
	}
	return p
}

// cTable returns the 256 values of the C array name in src.
func cTable(t *testing.T, src, name string) []uint32 {
	t.Helper()
	m := regexp.MustCompile(`(?s)` + name + `\[256\] = \{(.*?)\};`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("no array %s in bpf/crc32c.h", name)
	}
	var out []uint32
	for _, h := range regexp.MustCompile(`0x[0-9a-f]{8}`).FindAllString(m[1], -1) {
		v, _ := strconv.ParseUint(h[2:], 16, 32)
		out = append(out, uint32(v))
	}
	if len(out) != 256 {
		t.Fatalf("%s has %d values, want 256", name, len(out))
	}
	return out
}

// TestCRC32cTables checks the powers of x in bpf/crc32c.h, and that the
// way crc32c_delta uses them updates an SCTP packet's CRC32c as
// computing it again does (hash/crc32's Castagnoli table), for random
// packets whose first 4 bytes (the ports) change.
func TestCRC32cTables(t *testing.T) {
	b, err := os.ReadFile("bpf/crc32c.h")
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := cTable(t, string(b), "crc32c_x8k"), cTable(t, string(b), "crc32c_x2048k")
	x8 := uint32(0x80000000 >> 8)
	want := uint32(0x80000000)
	for k := range 256 {
		if lo[k] != want {
			t.Fatalf("crc32c_x8k[%d] = %#08x, want %#08x", k, lo[k], want)
		}
		want = crc32cMul(want, x8)
	}
	x2048, want := want, uint32(0x80000000)
	for k := range 256 {
		if hi[k] != want {
			t.Fatalf("crc32c_x2048k[%d] = %#08x, want %#08x", k, hi[k], want)
		}
		want = crc32cMul(want, x2048)
	}

	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	delta := func(d, n uint32) uint32 { // crc32c_delta
		k := n + 4
		return crc32cMul(d, crc32cMul(lo[k&0xff], hi[k>>8&0xff]))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		pkt := make([]byte, 12+r.IntN(9000))
		for i := range pkt {
			pkt[i] = byte(r.Uint32())
		}
		clear(pkt[8:12])
		sum := crc32.Checksum(pkt, castagnoli)
		old := binary.LittleEndian.Uint32(pkt)
		binary.LittleEndian.PutUint32(pkt, r.Uint32())
		got := sum ^ delta(old^binary.LittleEndian.Uint32(pkt), uint32(len(pkt)-4))
		if w := crc32.Checksum(pkt, castagnoli); got != w {
			t.Fatalf("%d bytes: updated CRC32c %#08x, computed %#08x", len(pkt), got, w)
		}
	}
}
