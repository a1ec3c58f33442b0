package ipvs

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// vsKey identifies an IPVS virtual server: address, protocol and port.
type vsKey struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

func (k vsKey) String() string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + string(k.Proto)
}

func compareKeys(a, b vsKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}

// vsKind says which traffic a virtual server receives.
type vsKind uint8

const (
	kindCluster  vsKind = iota // the cluster IP
	kindExternal               // an external IP
	kindLB                     // a load-balancer IP
	kindNodePort               // a node address and the node port
)

// vsSpec is the desired state of one virtual server.
type vsSpec struct {
	// Owner is the service port the virtual server belongs to, set when
	// the spec enters a [state].
	Owner model.ServicePortName
	Key   vsKey
	Kind  vsKind
	Sched string
	// Timeout is the persistence (session affinity) timeout in
	// seconds; 0 means no persistence.
	Timeout uint32
	// Dests are the real servers, sorted and unique, all of weight 1.
	Dests []netip.AddrPort
}

// sameService reports whether two specs need no UpdateService between
// them (real servers aside).
func (s *vsSpec) sameService(o *vsSpec) bool {
	return s.Sched == o.Sched && s.Timeout == o.Timeout
}

// Names of the nftables sets. Keys of the sets marked "key" are
// address . protocol . port.
const (
	setProtocols    = "protocols"     // tcp, udp, sctp
	setServiceAddrs = "service-addrs" // addresses on the dummy interface
	setVirtual      = "virtual"       // key: every virtual server the backend owns
	setReject       = "reject"        // key: services without endpoints
	setDrop         = "drop"          // key: policy Local without local endpoints
	setCluster      = "cluster"       // key: cluster IP virtual servers
	setMasqExternal = "masq-external" // key: external traffic with policy Cluster
	setFirewall     = "firewall"      // key: load-balancer IPs with source ranges
	setFirewallOK   = "firewall-allow"
	setHairpin      = "hairpin" // endpoint address . endpoint address
)

// elem is one element of one of the backend's nftables sets, in a
// family-neutral form; the nft layer encodes it.
type elem struct {
	Set string
	Key vsKey
	// Src is the source range of a firewall-allow element.
	Src netip.Prefix
	// Addr is the address of service-addrs and hairpin elements.
	Addr netip.Addr
}

func (e elem) String() string {
	switch e.Set {
	case setServiceAddrs:
		return e.Set + " " + e.Addr.String()
	case setHairpin:
		return e.Set + " " + e.Addr.String() + " . " + e.Addr.String()
	case setFirewallOK:
		return e.Set + " " + e.Key.String() + " . " + e.Src.String()
	}
	return e.Set + " " + e.Key.String()
}

// svcObjs is what one service port needs in the kernel.
type svcObjs struct {
	VS    []vsSpec     // sorted by key
	Addrs []netip.Addr // bound on the dummy interface, sorted
	Elems []elem
}

// renderer turns service ports into [svcObjs].
type renderer struct {
	fam        model.IPFamily
	scheduler  proxier.Scheduler
	nodeAddrs  []netip.Addr // addresses node ports open on, sorted
	affinityTO time.Duration
	log        *slog.Logger // nil: unknown schedulers are not logged
	nodeIP     netip.Addr   // the node's primary address, if known
}

// schedulerFor returns the scheduler of a service port: the one the
// Service asks for (annotation proxykit.io/scheduler) when the backend
// implements it (one of [Schedulers]), else the proxier's. An unknown
// one is logged and ignored, so a typo does not take the service down.
func (r *renderer) schedulerFor(sp *model.ServicePort) string {
	if sp.Scheduler == "" || proxier.Scheduler(sp.Scheduler) == r.scheduler {
		return string(r.scheduler)
	}
	s, err := proxier.ResolveScheduler("ipvs", proxier.Scheduler(sp.Scheduler), Schedulers())
	if err == nil {
		return string(s)
	}
	if r.log != nil {
		r.log.Warn("unknown IPVS scheduler asked for by the service, using the proxier's",
			"service", sp.Name.String(), "scheduler", sp.Scheduler, "using", r.scheduler, "err", err)
	}
	return string(r.scheduler)
}

// render computes what one service port needs. It fails for a port it
// cannot program (an address of another family, an invalid protocol).
func (r *renderer) render(sp *model.ServicePort, t *proxier.Targets) (*svcObjs, error) {
	if !sp.Protocol.Valid() {
		return nil, fmt.Errorf("invalid protocol %q", sp.Protocol)
	}
	if t == nil {
		t = &proxier.Targets{}
	}
	o := &svcObjs{}
	var timeout uint32
	if sp.SessionAffinity {
		to := sp.AffinityTimeout
		if to <= 0 {
			to = r.affinityTO
		}
		timeout = uint32(max(1, (to+time.Second-1)/time.Second))
	}
	internal, external := dests(t.Internal), dests(t.External)
	add := func(a netip.Addr, port uint16, kind vsKind) error {
		if !r.fam.Contains(a) {
			return fmt.Errorf("address %s is not %s", a, r.fam)
		}
		a = a.Unmap()
		d := external
		if kind == kindCluster {
			d = internal
		}
		o.VS = append(o.VS, vsSpec{
			Key:     vsKey{Addr: a, Proto: sp.Protocol, Port: port},
			Kind:    kind,
			Sched:   r.schedulerFor(sp),
			Timeout: timeout,
			Dests:   d,
		})
		if kind != kindNodePort {
			o.Addrs = append(o.Addrs, a)
		}
		return nil
	}
	if sp.ClusterIP.IsValid() {
		if err := add(sp.ClusterIP, sp.Port, kindCluster); err != nil {
			return nil, err
		}
	}
	for _, a := range sp.ExternalIPs {
		if err := add(a, sp.Port, kindExternal); err != nil {
			return nil, err
		}
	}
	for _, a := range sp.LoadBalancerIPs {
		if err := add(a, sp.Port, kindLB); err != nil {
			return nil, err
		}
	}
	if sp.NodePort != 0 {
		for _, a := range r.nodeAddrs {
			if err := add(a, sp.NodePort, kindNodePort); err != nil {
				return nil, err
			}
		}
	}
	// The same address may come twice (an external IP that is also a
	// load-balancer IP): one virtual server, the first kind wins.
	slices.SortStableFunc(o.VS, func(a, b vsSpec) int { return compareKeys(a.Key, b.Key) })
	o.VS = slices.CompactFunc(o.VS, func(a, b vsSpec) bool { return a.Key == b.Key })
	slices.SortFunc(o.Addrs, netip.Addr.Compare)
	o.Addrs = slices.Compact(o.Addrs)

	for _, a := range o.Addrs {
		o.Elems = append(o.Elems, elem{Set: setServiceAddrs, Addr: a})
	}
	for _, vs := range o.VS {
		k := vs.Key
		o.Elems = append(o.Elems, elem{Set: setVirtual, Key: k})
		switch {
		case !t.HasEndpoints:
			o.Elems = append(o.Elems, elem{Set: setReject, Key: k})
		case len(vs.Dests) == 0:
			o.Elems = append(o.Elems, elem{Set: setDrop, Key: k})
		}
		if vs.Kind == kindCluster {
			o.Elems = append(o.Elems, elem{Set: setCluster, Key: k})
		} else if !sp.ExternalLocal() {
			o.Elems = append(o.Elems, elem{Set: setMasqExternal, Key: k})
		}
		if vs.Kind == kindLB && len(sp.LoadBalancerSourceRanges) > 0 {
			o.Elems = append(o.Elems, elem{Set: setFirewall, Key: k})
			for _, src := range sp.LoadBalancerSourceRanges {
				if r.fam.Contains(src.Addr()) {
					o.Elems = append(o.Elems, elem{Set: setFirewallOK, Key: k, Src: src.Masked()})
				}
			}
			if sp.SourceRangesHold(r.nodeIP) {
				for _, a := range sp.LoadBalancerIPs {
					if r.fam.Contains(a) {
						o.Elems = append(o.Elems, elem{Set: setFirewallOK, Key: k, Src: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())})
					}
				}
			}
		}
	}
	for _, d := range slices.Concat(internal, external) {
		o.Elems = append(o.Elems, elem{Set: setHairpin, Addr: d.Addr()})
	}
	slices.SortFunc(o.Elems, compareElems)
	o.Elems = slices.Compact(o.Elems)
	return o, nil
}

// dests returns the endpoints' addresses, sorted and unique.
func dests(eps []*model.Endpoint) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		out = append(out, netip.AddrPortFrom(ep.Addr.Addr().Unmap(), ep.Addr.Port()))
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

func compareElems(a, b elem) int {
	return cmp.Or(
		strings.Compare(a.Set, b.Set),
		compareKeys(a.Key, b.Key),
		a.Addr.Compare(b.Addr),
		a.Src.Addr().Compare(b.Src.Addr()),
		cmp.Compare(a.Src.Bits(), b.Src.Bits()),
	)
}
