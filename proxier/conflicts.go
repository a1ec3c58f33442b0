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

// claimsOf appends the keys sp takes to dst. A caller passes a small
// array of its own, so that settling 100,000 service ports allocates
// nothing per port.
func claimsOf(dst []claimKey, sp *model.ServicePort) []claimKey {
	if sp.ClusterIP.IsValid() {
		dst = append(dst, claimKey{sp.ClusterIP, sp.Protocol, sp.Port})
	}
	for _, a := range sp.ExternalIPs {
		if a.IsValid() {
			dst = append(dst, claimKey{a, sp.Protocol, sp.Port})
		}
	}
	for _, a := range sp.LoadBalancerIPs {
		if a.IsValid() {
			dst = append(dst, claimKey{a, sp.Protocol, sp.Port})
		}
	}
	if sp.NodePort != 0 {
		dst = append(dst, claimKey{proto: sp.Protocol, port: sp.NodePort})
	}
	return dst
}

// claimant is a service port to settle and what it is now (nil: gone).
type claimant struct {
	name model.ServicePortName
	sp   *model.ServicePort
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
	var changed []claimant
	for _, n := range names {
		sp := services[n]
		if old, had := o.seen[n]; !had || old != sp {
			changed = append(changed, claimant{n, sp})
		}
	}
	return o.settle(changed)
}

// updateAll is [owners.update] of every service port of services and
// every one evaluated before: what a full sync settles. It walks the maps
// rather than a list of names, which at 100,000 service ports saves a
// lookup of each.
func (o *owners) updateAll(services map[model.ServicePortName]*model.ServicePort) (flipped []model.ServicePortName, rejectedNow map[model.ServicePortName]error) {
	var changed []claimant
	if n := len(services); n > bigMap && len(o.seen) == 0 && len(o.owner) == 0 {
		// The first sync: every port is new, and no map grows entry
		// by entry.
		o.seen = make(map[model.ServicePortName]*model.ServicePort, n)
		o.owner = make(map[claimKey]model.ServicePortName, n)
		changed = make([]claimant, 0, n)
	}
	for n, sp := range services {
		if old, had := o.seen[n]; !had || old != sp {
			changed = append(changed, claimant{n, sp})
		}
	}
	for n := range o.seen {
		if _, ok := services[n]; !ok {
			changed = append(changed, claimant{n, nil})
		}
	}
	return o.settle(changed)
}

// settle evaluates the changed service ports for update and updateAll.
func (o *owners) settle(changed []claimant) (flipped []model.ServicePortName, rejectedNow map[model.ServicePortName]error) {
	// Only the service ports that changed are settled, in name order;
	// a full sync hands in every name, most of them unchanged.
	slices.SortFunc(changed, func(a, b claimant) int { return a.name.Compare(b.name) })
	released := false
	reject := func(n model.ServicePortName, err error) {
		o.rejected[n] = err
		if rejectedNow == nil {
			rejectedNow = map[model.ServicePortName]error{}
		}
		rejectedNow[n] = err
		flipped = append(flipped, n)
	}
	var newcomers []claimant
	for _, c := range changed {
		n, sp := c.name, c.sp
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
			newcomers = append(newcomers, c)
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
	for _, c := range newcomers {
		n := c.name
		_, wasRejected := o.rejected[n]
		delete(o.rejected, n)
		if err := o.conflict(n, c.sp); err != nil {
			o.rejected[n] = err
			if !wasRejected {
				reject(n, err)
			}
			continue
		}
		o.take(n, c.sp)
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
	var buf [4]claimKey
	for _, k := range claimsOf(buf[:0], sp) {
		if other, ok := o.owner[k]; ok && other != n {
			return fmt.Errorf("%s is already served by %s", k, other)
		}
	}
	return nil
}

// take makes n the owner of every key of sp.
func (o *owners) take(n model.ServicePortName, sp *model.ServicePort) {
	var buf [4]claimKey
	for _, k := range claimsOf(buf[:0], sp) {
		o.owner[k] = n
	}
}

// release lets go of the keys n owns for old, except those keep (nil:
// none) also has, and reports whether any was let go.
func (o *owners) release(n model.ServicePortName, old, keep *model.ServicePort) bool {
	var keptBuf, oldBuf [4]claimKey
	var kept []claimKey
	if keep != nil {
		kept = claimsOf(keptBuf[:0], keep)
	}
	any := false
	for _, k := range claimsOf(oldBuf[:0], old) {
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
