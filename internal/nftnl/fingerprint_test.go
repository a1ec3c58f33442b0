package nftnl

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestFingerprint: batches that leave the same contents have the same
// fingerprint, whether they create the table or flush and refill it, and
// before or after a commit; any other chain, rule, set or element changes
// it.
func TestFingerprint(t *testing.T) {
	set := &Set{Name: "s", ID: 1, Key: TypeIPAddr}
	fill := func(b *Batch, elem byte, rule []byte) {
		b.AddSet(set)
		b.AddChain("c", nil)
		b.AddRule("c", rule)
		b.AddElems("s", []Elem{{Key: []byte{10, 0, 0, elem}}})
	}
	rule, err := Encode(unix.NFPROTO_IPV4, Rule{Drop()})
	if err != nil {
		t.Fatal(err)
	}
	other, err := Encode(unix.NFPROTO_IPV4, Rule{Return()})
	if err != nil {
		t.Fatal(err)
	}
	create := NewBatch(unix.NFPROTO_IPV4, "t")
	create.AddTable()
	fill(create, 1, rule)
	refill := NewBatch(unix.NFPROTO_IPV4, "t")
	refill.AddTable()
	refill.AddSet(set)
	refill.FlushSet("s")
	refill.AddChain("c", nil)
	refill.FlushChain("c")
	refill.DelChain("gone")
	refill.AddRule("c", rule)
	refill.AddElems("s", []Elem{{Key: []byte{10, 0, 0, 1}}})
	want := create.Fingerprint()
	if got := refill.Fingerprint(); got != want {
		t.Errorf("a batch that flushes and refills: %x, want %x as the one that creates", got, want)
	}
	if err := NewRecorder().Commit(t.Context(), create); err != nil {
		t.Fatal(err)
	}
	if got := create.Fingerprint(); got != want {
		t.Errorf("after the commit: %x, want %x", got, want)
	}
	for name, b := range map[string]*Batch{
		"another element": func() *Batch { b := NewBatch(unix.NFPROTO_IPV4, "t"); fill(b, 2, rule); return b }(),
		"another rule":    func() *Batch { b := NewBatch(unix.NFPROTO_IPV4, "t"); fill(b, 1, other); return b }(),
		"another table":   func() *Batch { b := NewBatch(unix.NFPROTO_IPV4, "u"); fill(b, 1, rule); return b }(),
	} {
		if b.Fingerprint() == want {
			t.Errorf("%s: same fingerprint", name)
		}
	}
}
