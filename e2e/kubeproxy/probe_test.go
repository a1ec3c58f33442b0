package kubeproxy_test

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// Probing parameters.
const (
	// probeTimeout bounds one TCP probe: a reject arrives well within it
	// (the first IPv6 one after neighbour discovery takes about 1 s), so a
	// probe that times out was dropped.
	probeTimeout = 2 * time.Second
	// tries is the number of connections per probe when the first one is
	// answered; the answering pods over them form a set.
	tries = 8
	// failTries is the number of connections per probe when the first
	// one is not answered.
	failTries = 3
	// extraTries are added on both sides when the answering sets differ,
	// to rule out chance (2 endpoints: 2·2^-8 per probe after 8 tries).
	extraTries = 24
	// confirmTries are the tries, one after the other, of a fresh probe
	// on both sides when one side's first tries ended in more than one
	// outcome class and the sides differ.
	confirmTries = 6
	// concurrency bounds the tries in flight across the test (each holds
	// an OS thread locked into a namespace; most wait for a timeout).
	concurrency = 1024
)

var probeSem = make(chan struct{}, concurrency)

// Clients.
const (
	cPod     = "pod"     // node1-pod2, never an endpoint
	cHairpin = "hairpin" // node1-pod1, the local endpoint (when it is one)
	cNode1   = "node1"   // node1 itself
	cOutside = "outside" // the client host outside the cluster
)

var clients = []string{cPod, cHairpin, cNode1, cOutside}

// Destinations.
const (
	dClusterIP  = "clusterIP"
	dNPInternal = "nodePort@internal" // node1's primary (node IP) address
	dNPExternal = "nodePort@external" // node1's address toward the client
	dNPLoopback = "nodePort@loopback" // 127.0.0.1 or ::1, from node1 only
	dExternalIP = "externalIP"
	dLBIP       = "lbIP"
)

// probe is one client, destination and protocol of a scenario.
type probe struct {
	client, dest string
	udp          bool
	addr         netip.AddrPort
}

func (p probe) String() string {
	proto := "tcp"
	if p.udp {
		proto = "udp"
	}
	return p.client + "->" + p.dest + "(" + proto + " " + p.addr.String() + ")"
}

// udpProbes are the (client, destination) pairs also probed over UDP, a
// sample: the TCP probes cover the matrix.
var udpProbes = map[[2]string]bool{
	{cPod, dClusterIP}:      true,
	{cOutside, dClusterIP}:  true,
	{cPod, dNPInternal}:     true,
	{cOutside, dNPExternal}: true,
	{cHairpin, dLBIP}:       true,
	{cOutside, dLBIP}:       true,
}

// probesFor returns the probes of a scenario, the same in both phases.
func probesFor(sc *scenario, tn *testnet.Topology) []probe {
	fam, typ := sc.fam, sc.phases[0].typ
	type dst struct {
		name     string
		addr     netip.Addr
		tcp, udp uint16
	}
	dsts := []dst{{dClusterIP, clusterIP(fam, sc.idx), 80, 53}}
	if typ != v1.ServiceTypeClusterIP {
		loop := netip.MustParseAddr("127.0.0.1")
		if fam == model.IPv6 {
			loop = netip.IPv6Loopback()
		}
		np, unp := uint16(nodePort(sc.idx)), uint16(udpNodePort(sc.idx))
		dsts = append(dsts,
			dst{dNPInternal, tn.Node1.IP(fam), np, unp},
			dst{dNPExternal, tn.Node1.ExternalIP(fam), np, unp},
			dst{dNPLoopback, loop, np, unp})
	}
	if typ == v1.ServiceTypeLoadBalancer {
		dsts = append(dsts,
			dst{dExternalIP, externalIP(fam, sc.idx), 80, 53},
			dst{dLBIP, lbIP(fam, sc.idx), 80, 53})
	}
	var out []probe
	for _, d := range dsts {
		for _, c := range clients {
			if d.name == dNPLoopback && c != cNode1 {
				continue
			}
			out = append(out, probe{client: c, dest: d.name, addr: netip.AddrPortFrom(d.addr, d.tcp)})
		}
	}
	for _, d := range dsts {
		for _, c := range clients {
			if udpProbes[[2]string{c, d.name}] {
				out = append(out, probe{client: c, dest: d.name, udp: true, addr: netip.AddrPortFrom(d.addr, d.udp)})
			}
		}
	}
	return out
}

// clientNS returns the namespace a client probes from.
func clientNS(tn *testnet.Topology, c string) *testnet.NS {
	switch c {
	case cPod:
		return tn.Node1.Pods[1].NS
	case cHairpin:
		return tn.Node1.Pods[0].NS
	case cNode1:
		return tn.Node1.NS
	case cOutside:
		return tn.Client.NS
	}
	panic("unknown client " + c)
}

// srcClass classes the source address an endpoint saw, as the test
// compares it: "client" when it is the address the probing host sent
// from (for a pod or the outside client its own address; for node1 the
// address its routing picks for the destination: the uplink address for
// service addresses, the destination itself for its own addresses),
// "node1" for any other address of node1 (masqueraded: the pod gateway
// or the address toward node2, depending on the endpoint), else
// "other:<address>".
func srcClass(tn *testnet.Topology, p probe, fam model.IPFamily, a netip.Addr) string {
	a = a.Unmap()
	var self netip.Addr
	switch p.client {
	case cPod:
		self = tn.Node1.Pods[1].IP(fam)
	case cHairpin:
		self = tn.Node1.Pods[0].IP(fam)
	case cOutside:
		self = tn.Client.IP(fam)
	case cNode1:
		switch p.dest {
		case dNPInternal, dNPExternal, dNPLoopback:
			self = p.addr.Addr()
		default:
			self = tn.Node1.UplinkIP(fam)
		}
	}
	if a == self {
		return "client"
	}
	if a == tn.Node1.Gateway(fam) || slices.Contains(tn.Node1.Addrs(fam), a) {
		return "node1"
	}
	return "other:" + a.String()
}

// obs accumulates the results of the tries of one probe in one sandbox.
type obs struct {
	mu       sync.Mutex
	outcomes map[string]int
	pods     map[string]int
	srcs     map[string]int
	errs     map[string]bool
	n        int
	// trail lists every try's result, for the report of an unlisted
	// difference.
	trail []string
}

func newObs() *obs {
	return &obs{outcomes: map[string]int{}, pods: map[string]int{}, srcs: map[string]int{}, errs: map[string]bool{}}
}

func (o *obs) add(tn *testnet.Topology, p probe, fam model.IPFamily, r testnet.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n++
	o.trail = append(o.trail, r.String())
	switch {
	case r.Outcome == testnet.Answered:
		o.outcomes["answered"]++
		o.pods[r.Server]++
		o.srcs[srcClass(tn, p, fam, r.Source.Addr())]++
	case r.Outcome.Rejected():
		o.outcomes["rejected"]++
	case r.Outcome.Silent():
		o.outcomes["dropped"]++
	default:
		o.outcomes["failed"]++
		o.errs[fmt.Sprint(r.Err)] = true
	}
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// summary is what is compared: the set of outcome classes and, when
// answered, the set of answering pods and the set of source classes, or
// with session affinity only whether the answering pod was always the
// same.
func (o *obs) summary(affinity bool) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.Join(keys(o.outcomes), "|")
	switch {
	case o.outcomes["answered"] == 0:
	case affinity:
		// Which pod the first try picks is chance, and the source
		// class follows the pod (masqueraded hairpin to itself, not
		// to the remote pod): compare only that the tries stuck.
		if len(o.pods) == 1 {
			s += " sticky"
		} else {
			s += " not-sticky"
		}
	default:
		s += " pods{" + strings.Join(keys(o.pods), ",") + "}"
		s += " src{" + strings.Join(keys(o.srcs), ",") + "}"
	}
	if len(o.errs) > 0 {
		var e []string
		for k := range o.errs {
			e = append(e, k)
		}
		slices.Sort(e)
		s += " errors{" + strings.Join(e, "; ") + "}"
	}
	return s
}

// try runs one probe (a TCP connection, or a UDP datagram from a new
// socket) under the concurrency bound.
func try(ns *testnet.NS, p probe) testnet.Result {
	probeSem <- struct{}{}
	defer func() { <-probeSem }()
	if p.udp {
		return ns.UDP(p.addr, probeTimeout)
	}
	return ns.TCP(p.addr, probeTimeout)
}

// run probes p in tn: one try, then tries-1 more one after the other
// (answered tries take a millisecond; bursts of parallel connections from
// node1 to its own node ports now and then meet a TIME_WAIT socket of a
// pod through the masquerade and get a reset), or failTries-1 more in
// parallel when the first was not answered (a drop waits for the
// timeout). With
// session affinity the first try sets the affinity the others should
// follow.
func (o *obs) run(tn *testnet.Topology, p probe, fam model.IPFamily) {
	ns := clientNS(tn, p.client)
	r := try(ns, p)
	o.add(tn, p, fam, r)
	if r.Outcome != testnet.Answered {
		o.more(tn, p, fam, failTries-1)
		return
	}
	o.seq(tn, p, fam, tries-1)
}

// seq runs n more tries one after the other.
func (o *obs) seq(tn *testnet.Topology, p probe, fam model.IPFamily, n int) {
	ns := clientNS(tn, p.client)
	for range n {
		o.add(tn, p, fam, try(ns, p))
	}
}

// more runs n more tries in parallel.
func (o *obs) more(tn *testnet.Topology, p probe, fam model.IPFamily, n int) {
	ns := clientNS(tn, p.client)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { o.add(tn, p, fam, try(ns, p)) })
	}
	wg.Wait()
}

// tries returns the tries' results, one per line.
func (o *obs) tries() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.trail, "\n")
}

// answered reports whether any try was answered.
func (o *obs) answered() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outcomes["answered"] > 0
}

// mixed reports whether the tries ended in more than one outcome class.
func (o *obs) mixed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.outcomes) > 1
}
