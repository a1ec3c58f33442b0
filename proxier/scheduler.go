package proxier

import (
	"fmt"
	"slices"
	"strings"
)

// Scheduler names a load-balancing algorithm: how a backend picks a
// service's endpoint for a new connection. It is the one naming of the
// algorithm for every backend, in a backend's Config (the proxier's
// default) and in a service port's own choice
// ([model.ServicePort.Scheduler], the proxykit.io/scheduler annotation).
// The names are IPVS's (kube-proxy's --ipvs-scheduler), plus
// [SchedulerRandom]. A backend implements some of them and rejects
// another one with an [*UnsupportedError] (see [ResolveScheduler]).
type Scheduler string

// The schedulers. Each backend's documentation says which it implements:
// IPVS all but [SchedulerRandom], eBPF [SchedulerRandom] and
// [SchedulerMaglev]; nftables and iptables always pick at random.
const (
	// SchedulerRoundRobin takes the endpoints in turn (IPVS rr).
	SchedulerRoundRobin Scheduler = "rr"
	// SchedulerWeightedRoundRobin takes the endpoints in turn, in
	// proportion to their weights (IPVS wrr).
	SchedulerWeightedRoundRobin Scheduler = "wrr"
	// SchedulerLeastConnection takes the endpoint with the fewest active
	// connections (IPVS lc).
	SchedulerLeastConnection Scheduler = "lc"
	// SchedulerWeightedLeastConnection is [SchedulerLeastConnection]
	// relative to the endpoints' weights (IPVS wlc).
	SchedulerWeightedLeastConnection Scheduler = "wlc"
	// SchedulerLocalityLeastConnection keeps a destination address on
	// one endpoint unless it is overloaded (IPVS lblc).
	SchedulerLocalityLeastConnection Scheduler = "lblc"
	// SchedulerLocalityLeastConnectionReplication keeps a destination
	// address on a set of endpoints (IPVS lblcr).
	SchedulerLocalityLeastConnectionReplication Scheduler = "lblcr"
	// SchedulerDestinationHashing picks by a hash of the destination
	// address (IPVS dh).
	SchedulerDestinationHashing Scheduler = "dh"
	// SchedulerSourceHashing picks by a hash of the source address
	// (IPVS sh).
	SchedulerSourceHashing Scheduler = "sh"
	// SchedulerShortestExpectedDelay takes the endpoint with the
	// shortest expected delay (IPVS sed).
	SchedulerShortestExpectedDelay Scheduler = "sed"
	// SchedulerNeverQueue takes an idle endpoint if there is one, else
	// as [SchedulerShortestExpectedDelay] (IPVS nq).
	SchedulerNeverQueue Scheduler = "nq"
	// SchedulerMaglev picks by Maglev consistent hashing (IPVS mh;
	// Cilium's bpf-lb-algorithm calls it maglev, which
	// [Scheduler.Canonical] accepts too).
	SchedulerMaglev Scheduler = "mh"
	// SchedulerRandom picks an endpoint at random (eBPF's default, and
	// what nftables and iptables do).
	SchedulerRandom Scheduler = "random"
)

// Schedulers returns every scheduler name, in a new slice.
func Schedulers() []Scheduler {
	return []Scheduler{
		SchedulerRoundRobin, SchedulerWeightedRoundRobin, SchedulerLeastConnection,
		SchedulerWeightedLeastConnection, SchedulerLocalityLeastConnection,
		SchedulerLocalityLeastConnectionReplication, SchedulerDestinationHashing,
		SchedulerSourceHashing, SchedulerShortestExpectedDelay, SchedulerNeverQueue,
		SchedulerMaglev, SchedulerRandom,
	}
}

// Canonical returns the name s stands for: in lower case, without
// surrounding space, and with the alias "maglev" as [SchedulerMaglev].
// A name that is not one of [Schedulers] is returned in that form, and
// ok is false.
func (s Scheduler) Canonical() (c Scheduler, ok bool) {
	c = Scheduler(strings.ToLower(strings.TrimSpace(string(s))))
	if c == "maglev" {
		c = SchedulerMaglev
	}
	return c, slices.Contains(Schedulers(), c)
}

// ResolveScheduler returns the canonical name of s (see
// [Scheduler.Canonical]) when it is one of supported, the schedulers the
// backend named backend implements. Otherwise it returns an
// [*UnsupportedError] naming s and the backend's schedulers, which
// matches [ErrNotSupported].
func ResolveScheduler(backend string, s Scheduler, supported []Scheduler) (Scheduler, error) {
	c, _ := s.Canonical()
	if slices.Contains(supported, c) {
		return c, nil
	}
	names := make([]string, len(supported))
	for i, x := range supported {
		names[i] = string(x)
	}
	return "", &UnsupportedError{Backend: backend, What: fmt.Sprintf("scheduler %q (it has %s)", string(s), strings.Join(names, ", "))}
}
