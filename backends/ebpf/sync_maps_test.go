package ebpf

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/testnet"
)

// newSlotMap returns an unpinned copy of pk_be4 of size entries.
func newSlotMap(t *testing.T, size int) *ebpf.Map {
	t.Helper()
	spec, err := loadSock()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[mapBe4].Copy()
	ms.MaxEntries = uint32(size)
	ms.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// slotBatch returns n slots of distinct groups and endpoints.
func slotBatch(n int) ([]beKey, []netip.AddrPort) {
	keys := make([]beKey, n)
	vals := make([]netip.AddrPort, n)
	for i := range n {
		keys[i] = beKey{ID: uint32(i/10 + 1), Slot: uint32(i % 10)}
		vals[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(i))
	}
	return keys, vals
}

// TestMapBatchPutSplit: a batch large enough to be written by several
// threads, of slots listed and of whole groups, lands whole, and one
// that does not fit is a *MapFullError naming the map.
func TestMapBatchPutSplit(t *testing.T) {
	testnet.RequireRoot(t)
	n := 3*parallelBatch + 7
	keys, vals := slotBatch(n)
	m := newSlotMap(t, n)
	// The first slots listed, the others as whole groups.
	listed := n / 20 * 10
	var groups []*group
	for i := listed; i < n; i += 10 {
		groups = append(groups, &group{id: keys[i].ID, eps: vals[i:min(i+10, n)]})
	}
	if err := (codec4{}).putBe(m, keys[:listed], vals[:listed], groups); err != nil {
		t.Fatal(err)
	}
	have, err := (codec4{}).readBe(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(have) != n {
		t.Fatalf("map holds %d slots, want %d", len(have), n)
	}
	for i, k := range keys {
		if have[k] != vals[i] {
			t.Fatalf("slot %+v: %v, want %v", k, have[k], vals[i])
		}
	}

	small := newSlotMap(t, n-1)
	err = (codec4{}).putBe(small, keys, vals, nil)
	var full *MapFullError
	if !errors.As(err, &full) || full.Map != mapBe4 || full.Field != "MaxBackends" {
		t.Fatalf("writing %d slots into a map of %d: %v, want a MapFullError of %s", n, n-1, err, mapBe4)
	}
}
