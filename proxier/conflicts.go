package proxier

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/proxykit/proxykit/model"
)

// claimKey is what one service port takes for itself in the dataplane:
// an address, protocol and port (a cluster, external or load-balancer
// IP), or a protocol and node port (addr invalid).
type claimKey struct {
	addr  netip.Addr
	proto model.Protocol
	port  uint16
}

func (k claimKey) String() string {
	if !k.addr.IsValid() {
		return fmt.Sprintf("node port %s/%d", k.proto, k.port)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.addr, k.port), k.proto)
}

// claimsOf lists the keys sp takes.
func claimsOf(sp *model.ServicePort) []claimKey {
	var keys []claimKey
	add := func(a netip.Addr) {
		if a.IsValid() {
			keys = append(keys, claimKey{a, sp.Protocol, sp.Port})
		}
	}
	add(sp.ClusterIP)
	for _, a := range sp.ExternalIPs {
		add(a)
	}
	for _, a := range sp.LoadBalancerIPs {
		add(a)
	}
	if sp.NodePort != 0 {
		keys = append(keys, claimKey{proto: sp.Protocol, port: sp.NodePort})
	}
	return keys
}

// owners settles which service port owns each address, protocol and
// port of a family. The first service port to claim a key keeps it; a
// later one that claims a key already owned is rejected as a whole, and
// is not programmed, until the owner lets the key go. Service ports that
// claim the same key in the same sync are settled in name order.
type owners struct {
	owner    map[claimKey]model.ServicePortName
	seen     map[model.ServicePortName]*model.ServicePort // last evaluated
	rejected map[model.ServicePortName]error
}

func newOwners() *owners {
	return &owners{
		owner:    map[claimKey]model.ServicePortName{},
		seen:     map[model.ServicePortName]*model.ServicePort{},
		rejected: map[model.ServicePortName]error{},
	}
}

// update evaluates the service ports of names against services (the
// family's state; a missing name is deleted), and then retries the
// rejected ones if a key was let go. It reports the service ports whose
// acceptance changed (newly rejected, or accepted after a rejection), so
// that they are programmed again, and the errors of the newly rejected.
// A service port that changes keeps the keys it owned; service ports
// that owned keys before are settled before newcomers.
func (o *owners) update(services map[model.ServicePortName]*model.ServicePort, names []model.ServicePortName) (flipped []model.ServicePortName, rejectedNow map[model.ServicePortName]error) {
	// Only the service ports that changed are settled, in name order;
	// a full sync hands in every name, most of them unchanged.
	changed := names[:0:0]
	for _, n := range names {
		if old, had := o.seen[n]; !had || old != services[n] {
			changed = append(changed, n)
		}
	}
	slices.SortFunc(changed, model.ServicePortName.Compare)
	released := false
	reject := func(n model.ServicePortName, err error) {
		o.rejected[n] = err
		if rejectedNow == nil {
			rejectedNow = map[model.ServicePortName]error{}
		}
		rejectedNow[n] = err
		flipped = append(flipped, n)
	}
	var newcomers []model.ServicePortName
	for _, n := range changed {
		sp := services[n]
		old, had := o.seen[n]
		_, wasRejected := o.rejected[n]
		if sp == nil {
			if had && !wasRejected && o.release(n, old, nil) {
				released = true
			}
			delete(o.seen, n)
			delete(o.rejected, n)
			continue
		}
		o.seen[n] = sp
		if !had || wasRejected {
			newcomers = append(newcomers, n)
			continue
		}
		// An owner that changed keeps what it owned.
		if err := o.conflict(n, sp); err != nil {
			if o.release(n, old, nil) {
				released = true
			}
			reject(n, err)
			continue
		}
		if o.release(n, old, sp) {
			released = true
		}
		o.take(n, sp)
	}
	for _, n := range newcomers {
		_, wasRejected := o.rejected[n]
		delete(o.rejected, n)
		if err := o.conflict(n, o.seen[n]); err != nil {
			o.rejected[n] = err
			if !wasRejected {
				reject(n, err)
			}
			continue
		}
		o.take(n, o.seen[n])
		if wasRejected {
			flipped = append(flipped, n)
		}
	}
	if released && len(o.rejected) > 0 {
		for _, n := range slices.SortedFunc(maps.Keys(o.rejected), model.ServicePortName.Compare) {
			if _, now := rejectedNow[n]; now {
				continue
			}
			if o.conflict(n, o.seen[n]) == nil {
				o.take(n, o.seen[n])
				delete(o.rejected, n)
				flipped = append(flipped, n)
			}
		}
	}
	return flipped, rejectedNow
}

// conflict returns why n cannot have every key of sp: one is owned by
// another service port.
func (o *owners) conflict(n model.ServicePortName, sp *model.ServicePort) error {
	for _, k := range claimsOf(sp) {
		if other, ok := o.owner[k]; ok && other != n {
			return fmt.Errorf("%s is already served by %s", k, other)
		}
	}
	return nil
}

// take makes n the owner of every key of sp.
func (o *owners) take(n model.ServicePortName, sp *model.ServicePort) {
	for _, k := range claimsOf(sp) {
		o.owner[k] = n
	}
}

// release lets go of the keys n owns for old, except those keep (nil:
// none) also has, and reports whether any was let go.
func (o *owners) release(n model.ServicePortName, old, keep *model.ServicePort) bool {
	var kept []claimKey
	if keep != nil {
		kept = claimsOf(keep)
	}
	any := false
	for _, k := range claimsOf(old) {
		if o.owner[k] == n && !slices.Contains(kept, k) {
			delete(o.owner, k)
			any = true
		}
	}
	return any
}

// accepted reports whether n may be programmed.
func (o *owners) accepted(n model.ServicePortName) bool {
	_, bad := o.rejected[n]
	return !bad
}
