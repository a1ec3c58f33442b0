package nftnl

import (
	"crypto/sha256"
	"encoding/binary"
)

// Fingerprint returns a SHA-256 hash of what the batch adds: its chain,
// rule, set and element messages, in order, without their sequence
// numbers and flags. Deletions, flushes and table messages are left out,
// so that two batches that fill a table with the same contents, one
// creating it and one flushing and refilling it, have the same
// fingerprint. It can be called before or after the batch is committed.
func (b *Batch) Fingerprint() [sha256.Size]byte {
	h := sha256.New()
	off := int(binary.NativeEndian.Uint32(b.buf)) // after BATCH_BEGIN
	off = align4(off)
	for _, l := range b.labels {
		n := int(binary.NativeEndian.Uint32(b.buf[off:]))
		switch l.op {
		case opAddChain, opAddRule, opAddSet, opAddElems:
			h.Write(b.buf[off+4 : off+6]) // type
			h.Write(b.buf[off+nlmsgHdrLen : off+n])
		}
		off += align4(n)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
