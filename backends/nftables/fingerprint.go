package nftables

import (
	"encoding/hex"
	"strings"
)

// A full sync records what it wrote in the table itself: the name of an
// empty chain, never jumped to, "fingerprint-" and 32 hex digits of the
// SHA-256 of the transaction's chains, rules, sets and elements
// ([nftnl.Batch.Fingerprint]), added by the same transaction. The first
// full sync of a process builds its transaction as usual and, when the
// kernel holds exactly the chains and sets it would write plus the
// fingerprint chain of the same hash, adopts the table instead of
// rewriting it: nothing is sent, the state it rendered becomes the
// backend's, and the affinity sets keep their clients.
//
// What is trusted: that nobody changed the table's rules and elements
// since the fingerprint was written, without touching its chains, sets
// or the fingerprint chain. The next full sync (every SyncPeriod)
// rewrites the table whatever it holds. An incremental sync deletes the
// fingerprint chain in its own transaction (the table no longer holds
// what a full sync of the same state wrote), so a process that starts
// after one takes the table over; so does one whose rendering differs in
// any byte (another version, other service port ids).

// fingerprintPrefix starts the name of the fingerprint chain.
const fingerprintPrefix = "fingerprint-"

func isFingerprint(chain string) bool { return strings.HasPrefix(chain, fingerprintPrefix) }

// addFingerprint computes the fingerprint of f's transaction, adds its
// chain at the end of it and deletes the fingerprint chains of stale
// (the chains the table holds) that differ.
func (b *backend) addFingerprint(f *fullTx, stale []string) {
	sum := f.tx.Fingerprint()
	f.fingerprint = fingerprintPrefix + hex.EncodeToString(sum[:16])
	f.tx.SetOwner(owner(nil))
	for _, c := range stale {
		if isFingerprint(c) && c != f.fingerprint {
			f.tx.DelChain(c)
		}
	}
	f.tx.AddChain(f.fingerprint, nil)
}

// holds reports whether a table of chains and sets holds what f writes,
// as far as its fingerprint chain and the names of its chains and sets
// tell.
func (f *fullTx) holds(chains, sets []string) bool {
	if len(chains) != len(f.chains)+1 || len(sets) != len(f.sets) {
		return false
	}
	for _, c := range chains {
		if c != f.fingerprint && !f.chains[c] {
			return false
		}
	}
	for _, s := range sets {
		if !f.sets[s] {
			return false
		}
	}
	return true
}
