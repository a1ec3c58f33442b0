package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/proxykit/proxykit/model"
)

// maxChainName is the longest chain name iptables takes
// (XT_EXTENSION_MAXNAMELEN less the terminating NUL).
const maxChainName = 28

// maxPrefix is the longest chain prefix: "<prefix>-EXTERNAL-SERVICES"
// must fit.
const maxPrefix = maxChainName - len("-EXTERNAL-SERVICES")

// minHash is the shortest hash a per-service chain name may carry.
const minHash = 12

// table is an iptables table the backend writes.
type table int

// The tables, in the order a restore input holds them.
const (
	tNAT table = iota
	tFilter
	numTables
)

var tableNames = [numTables]string{"nat", "filter"}

func (t table) String() string { return tableNames[t] }

// Suffixes of the fixed chains, after "<prefix>-".
const (
	// nat and filter
	chServices  = "SERVICES"  // nat: dispatch to per-service chains; filter: cluster IP rejects
	chNodePorts = "NODEPORTS" // nat: node port dispatch; filter: node port rejects
	chCanary    = "CANARY"    // holds one rule; its absence means we were flushed
	// nat
	chFingerprint = "FINGERPRINT" // one rule whose comment is the hash of what the last rewrite wrote (fingerprint.go)
	// nat
	chPostrouting = "POSTROUTING"  // masquerades marked packets
	chMarkOutside = "MARK-OUTSIDE" // marks sources outside several cluster CIDRs
	// filter
	chExternal = "EXTERNAL-SERVICES" // external IP, LB IP and node port rejects and drops
	chFirewall = "FIREWALL"          // drops LB traffic the FW chains did not accept
)

// Kinds of per-service chains, "<prefix>-<kind>-<hash>".
const (
	kindSVC = "SVC" // balances cluster IP traffic over the internal endpoints
	kindEXT = "EXT" // external traffic: marks, or routes pods and the node; then balances
	kindXLB = "XLB" // balances external traffic when its endpoints differ from SVC's
	kindFW  = "FW"  // load-balancer source ranges
	kindSEP = "SEP" // one endpoint: hairpin masquerade and DNAT
	kindALL = "ALL" // balances pods and the node over all endpoints of a service with both policies Local
)

// names makes chain names for one prefix.
type names struct {
	prefix  string
	hashLen int
}

func newNames(prefix string) (names, error) {
	if prefix == "" || len(prefix) > maxPrefix {
		return names{}, fmt.Errorf("chain prefix %q: want 1 to %d characters", prefix, maxPrefix)
	}
	for _, c := range prefix {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return names{}, fmt.Errorf("chain prefix %q: only letters, digits, - and _", prefix)
		}
	}
	n := names{prefix: prefix, hashLen: min(16, maxChainName-len(prefix)-len("-SVC-"))}
	if n.hashLen < minHash {
		return names{}, fmt.Errorf("chain prefix %q leaves too short a hash", prefix)
	}
	return n, nil
}

// fixed returns the name of a fixed chain.
func (n names) fixed(suffix string) string { return n.prefix + "-" + suffix }

// owns reports whether chain carries the prefix.
func (n names) owns(chain string) bool { return strings.HasPrefix(chain, n.prefix+"-") }

// hash returns the chain-name hash of s, as kube-proxy makes it: the
// start of the base32 SHA-256.
func (n names) hash(s string) string { return string(n.appendHash(nil, []byte(s))) }

// appendHash appends the chain-name hash of s to b.
func (n names) appendHash(b, s []byte) []byte {
	sum := sha256.Sum256(s)
	// Base32 encodes 5 bytes as 8 characters, each group on its own:
	// 10 bytes give the first 16 characters of the whole sum's encoding.
	var enc [16]byte
	base32.StdEncoding.Encode(enc[:], sum[:10])
	return append(b, enc[:n.hashLen]...)
}

// appendChain appends "<prefix>-<kind>-" and the hash of s to b.
func (n names) appendChain(b []byte, kind string, s []byte) []byte {
	b = append(b, n.prefix...)
	b = append(b, '-')
	b = append(b, kind...)
	b = append(b, '-')
	return n.appendHash(b, s)
}

// serviceHash is the hash shared by a service port's chains.
func (n names) serviceHash(name model.ServicePortName) string { return n.hash(name.String()) }

// chain returns "<prefix>-<kind>-<hash>".
func (n names) chain(kind, hash string) string { return n.prefix + "-" + kind + "-" + hash }

// sep names the endpoint chain of endpoint ep ("ip:port") of a service
// port. It is also the name of the endpoint's session affinity list.
func (n names) sep(name model.ServicePortName, ep string) string {
	return n.chain(kindSEP, n.hash(name.String()+"|"+ep))
}
