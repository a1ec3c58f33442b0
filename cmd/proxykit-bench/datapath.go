package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxykit/proxykit/internal/cgroup2"
	"github.com/proxykit/proxykit/internal/scale"
	"github.com/proxykit/proxykit/internal/testnet"
)

// The data-path mode (--datapath) measures what a packet costs on each
// path rather than what programming the kernel costs: a client outside
// the cluster sends traffic to a node port of node1 whose one endpoint
// is a pod behind node2 (testnet's client — node1 — node2 — pod), with
// the size's services loaded into node1's dataplane besides.
//
//   - TCP_CRR: concurrent clients in the client namespace open a
//     connection, send a request, read the response and the server's
//     close, and close; transactions per second and their latency.
//   - UDP at saturation: an AF_PACKET sender in the client namespace
//     sends pre-built 60-byte frames at full speed to the node port;
//     packets per second that reach the endpoint pod, and what node1
//     did not forward.
//   - UDP forwarded by node1: the same sender while node2's interface
//     toward node1 counts and drops every packet from node1 at XDP
//     (the sink, datapath_wire.go): packets per second node1 forwarded,
//     without node2's and the pod's work after it.
//
// Every path of a size is set up first and stays up; the runs then go
// round the paths Repeat times (in a rotating order), so that the
// machine's other load spreads over every path alike and the ratios
// compare within the run.

// dpPath is one data path: direct (no service), a proxykit backend with
// its options, or a kube-proxy layout.
type dpPath struct {
	Name, Label string
	// Backend is the proxykit backend (newProxier's name), empty for
	// direct and the references.
	Backend string
	// EBPF sets fields of ebpf.Config by name, as strings. A field the
	// Config lacks, or a value New refuses, makes the path "not
	// available": options still being built are listed here before the
	// backend has them, and light up when it does.
	EBPF map[string]string
	// Ref is a kube-proxy reference.
	Ref string
}

// dpPaths are the data paths, in the report's order. Adding one is a
// line here.
var dpPaths = []dpPath{
	{Name: "direct", Label: "direct to the endpoint (no service)"},
	{Name: "nftables", Label: "nftables", Backend: "nftables"},
	{Name: "iptables-nft", Label: "iptables (nft)", Backend: "iptables-nft"},
	{Name: "iptables-legacy", Label: "iptables (legacy)", Backend: "iptables-legacy"},
	{Name: "ebpf", Label: "ebpf (+ nftables north-south)", Backend: "ebpf"},
	{Name: "ebpf-tc", Label: "ebpf (tc north-south, SNAT)", Backend: "ebpf", EBPF: map[string]string{"NorthSouth": "tc"}},
	// Direct server return: node2 runs a backend too (dsr), and the
	// client has a link to node2, over which the endpoint replies.
	{Name: "ebpf-tc-dsr", Label: "ebpf (tc north-south, DSR)", Backend: "ebpf", EBPF: map[string]string{"NorthSouth": "tc", "NorthSouthForwarding": "dsr"}},
	// The rig's veth peers take XDP frames and send complete checksums
	// (datapath_wire.go), so XDP may send out of node1's veths.
	{Name: "ebpf-xdp", Label: "ebpf (XDP north-south)", Backend: "ebpf", EBPF: map[string]string{"NorthSouth": "xdp", "NorthSouthXDPVeth": "true"}},
	// XDP passes flows by direct server return to tc (it does not
	// wrap): what XDP in front costs them.
	{Name: "ebpf-xdp-dsr", Label: "ebpf (XDP north-south, DSR: XDP passes to tc)", Backend: "ebpf", EBPF: map[string]string{"NorthSouth": "xdp", "NorthSouthXDPVeth": "true", "NorthSouthForwarding": "dsr"}},
	{Name: refNFT, Label: "kube-proxy nftables (nft -f)", Ref: refNFT},
	{Name: refIPTablesNFT, Label: "kube-proxy iptables, nft", Ref: refIPTablesNFT},
	{Name: refIPTablesLegacy, Label: "kube-proxy iptables, legacy", Ref: refIPTablesLegacy},
}

// xdp says the path runs the eBPF backend's XDP program, whose counters
// each run reads.
func (p dpPath) xdp() bool { return p.EBPF["NorthSouth"] == "xdp" }

// dsr says the path sends flows to node2's endpoint by direct server
// return (hybrid: its TCP flows): its topology links the client to
// node2, and node2 runs an eBPF backend of its own (node2EBPF) that
// unwraps them.
func (p dpPath) dsr() bool {
	f := p.EBPF["NorthSouthForwarding"]
	return f == "dsr" || f == "hybrid"
}

// node2EBPF returns the ebpf.Config fields of node2's backend on a DSR
// path: node1's, with tc north-south (node2 needs no XDP: what it
// unwraps goes to a pod's veth, and the endpoint's replies leave from
// the pod's).
func (p dpPath) node2EBPF() map[string]string {
	out := maps.Clone(p.EBPF)
	out["NorthSouth"] = "tc"
	delete(out, "NorthSouthXDPVeth")
	return out
}

func dpPathNames() []string {
	var out []string
	for _, p := range dpPaths {
		out = append(out, p.Name)
	}
	return out
}

func dpPathByName(name string) (dpPath, bool) {
	for _, p := range dpPaths {
		if p.Name == name {
			return p, true
		}
	}
	return dpPath{}, false
}

// unavailableError says a backend lacks an option a path asks for.
type unavailableError struct{ msg string }

func (e *unavailableError) Error() string { return e.msg }

// setConfigFields sets the named fields of the struct *cfg points to
// from strings (string, bool and integer kinds, also of named types). A
// field the struct lacks is an *unavailableError: the option does not
// exist yet.
func setConfigFields(cfg any, fields map[string]string) error {
	v := reflect.ValueOf(cfg).Elem()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range fields {
			if !yield(k) {
				return
			}
		}
	}) {
		val := fields[name]
		f := v.FieldByName(name)
		if !f.IsValid() || !f.CanSet() {
			return &unavailableError{fmt.Sprintf("%s has no field %s (for %s=%q)", v.Type(), name, name, val)}
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString(val)
		case reflect.Bool:
			b, err := strconv.ParseBool(val)
			if err != nil {
				return fmt.Errorf("%s.%s: %w", v.Type(), name, err)
			}
			f.SetBool(b)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			n, err := strconv.ParseInt(val, 0, 64)
			if err != nil {
				return fmt.Errorf("%s.%s: %w", v.Type(), name, err)
			}
			f.SetInt(n)
		default:
			return &unavailableError{fmt.Sprintf("%s.%s is a %s, not settable from %q", v.Type(), name, f.Type(), val)}
		}
	}
	return nil
}

// The measured services: one TCP and one UDP service, each with a node
// port and one endpoint, the pod behind node2. Their ports are not the
// testnet servers' (8080-8082, 9000): the pod's TCP port is served by
// the TCP_CRR server child, and nothing listens on its UDP port (the
// datagrams are counted at the pod's interface).
const (
	dpServicePort = 80
	dpTCPPort     = 5201
	dpUDPPort     = 5202
	dpTCPNodePort = 32080
	dpUDPNodePort = 32081
)

type dpService struct {
	name               string
	proto              v1.Protocol
	clusterIP          netip.Addr
	nodePort, podPort  uint16
	chainKey, iptProto string
}

var dpMeasured = []dpService{
	{name: "dp-tcp", proto: v1.ProtocolTCP, clusterIP: netip.MustParseAddr("10.100.0.20"), nodePort: dpTCPNodePort, podPort: dpTCPPort, chainKey: "BENCHDPTCP", iptProto: "tcp"},
	{name: "dp-udp", proto: v1.ProtocolUDP, clusterIP: netip.MustParseAddr("10.100.0.21"), nodePort: dpUDPNodePort, podPort: dpUDPPort, chainKey: "BENCHDPUDP", iptProto: "udp"},
}

// dpFiller returns the size's generated services, without the node
// ports of the measured ones.
func dpFiller(sz Size) []scale.Service {
	svcs := scale.Services(sz.Services, sz.Endpoints)
	for i := range svcs {
		if svcs[i].NodePort == dpTCPNodePort || svcs[i].NodePort == dpUDPNodePort {
			svcs[i].NodePort = 0
		}
	}
	return svcs
}

// objects returns the measured service's Service and EndpointSlice with
// endpoint ep on node2.
func (d dpService) objects(uid int, ep netip.Addr) (*v1.Service, *discoveryv1.EndpointSlice) {
	s := scale.Service{Name: d.name, ClusterIP: d.clusterIP, NodePort: d.nodePort, Endpoints: []netip.Addr{ep}, EndpointNode: testnet.Node2Name}
	o := s.Object(uid)
	o.Spec.Ports[0].Protocol = d.proto
	o.Spec.Ports[0].TargetPort = intstr.FromInt32(int32(d.podPort))
	sl := s.Slice(0)
	proto, port := d.proto, int32(d.podPort)
	sl.Ports[0].Protocol, sl.Ports[0].Port = &proto, &port
	return o, sl
}

// dpKubeProxyNFT returns kube-proxy's nftables rule set for the filler
// services and the measured ones (same layout as scale.KubeProxyNFT).
func dpKubeProxyNFT(filler []scale.Service, ep netip.Addr) string {
	var w strings.Builder
	w.WriteString(scale.KubeProxyNFT(filler))
	t := scale.NFTTable
	for _, d := range dpMeasured {
		suffix := fmt.Sprintf("%s/%s/%s/%s", scale.Namespace, d.name, d.iptProto, scale.PortName)
		epc := fmt.Sprintf("endpoint-%s-%s__%s/%d", d.chainKey, suffix, ep, d.podPort)
		svc := fmt.Sprintf("service-%s-%s", d.chainKey, suffix)
		ext := fmt.Sprintf("external-%s-%s", d.chainKey, suffix)
		p := func(format string, args ...any) { fmt.Fprintf(&w, format+"\n", args...) }
		p("add chain ip %s %s", t, epc)
		p("add rule ip %s %s ip saddr %s jump mark-for-masquerade", t, epc, ep)
		p("add rule ip %s %s meta l4proto %s dnat to %s:%d", t, epc, d.iptProto, ep, d.podPort)
		p("add chain ip %s %s", t, svc)
		p("add rule ip %s %s ip daddr %s %s dport %d ip saddr != %s jump mark-for-masquerade", t, svc, d.clusterIP, d.iptProto, dpServicePort, scale.ClusterCIDR)
		p("add rule ip %s %s numgen random mod 1 vmap { 0 : goto %s }", t, svc, epc)
		p("add element ip %s cluster-ips { %s }", t, d.clusterIP)
		p("add element ip %s service-ips { %s . %s . %d : goto %s }", t, d.clusterIP, d.iptProto, dpServicePort, svc)
		p("add chain ip %s %s", t, ext)
		p("add rule ip %s %s jump mark-for-masquerade", t, ext)
		p("add rule ip %s %s goto %s", t, ext, svc)
		p("add element ip %s service-nodeports { %s . %d : goto %s }", t, d.iptProto, d.nodePort, ext)
	}
	return w.String()
}

// dpKubeProxyIPTables returns kube-proxy's iptables rule set for the
// filler services and the measured ones (same layout as
// scale.KubeProxyIPTables), the measured services' rules in the middle
// of KUBE-SERVICES and of KUBE-NODEPORTS, which every new connection to
// a node port walks.
func dpKubeProxyIPTables(filler []scale.Service, ep netip.Addr) string {
	lines := strings.SplitAfter(scale.KubeProxyIPTables(filler), "\n")
	var decl, svcRules, npRules, rest []string
	for _, d := range dpMeasured {
		svc, ext, sep := "KUBE-SVC-"+d.chainKey, "KUBE-EXT-"+d.chainKey, "KUBE-SEP-"+d.chainKey
		pn := fmt.Sprintf("%s/%s:%s", scale.Namespace, d.name, scale.PortName)
		m := fmt.Sprintf("-m %s -p %s", d.iptProto, d.iptProto)
		decl = append(decl, ":"+svc+" - [0:0]\n", ":"+ext+" - [0:0]\n", ":"+sep+" - [0:0]\n")
		svcRules = append(svcRules, fmt.Sprintf("-A KUBE-SERVICES -m comment --comment \"%s cluster IP\" %s -d %s/32 --dport %d -j %s\n", pn, m, d.clusterIP, dpServicePort, svc))
		npRules = append(npRules, fmt.Sprintf("-A KUBE-NODEPORTS -m comment --comment %s %s --dport %d -j %s\n", pn, m, d.nodePort, ext))
		rest = append(rest,
			fmt.Sprintf("-A %s -m comment --comment \"%s cluster IP\" %s -d %s/32 --dport %d ! -s %s -j KUBE-MARK-MASQ\n", svc, pn, m, d.clusterIP, dpServicePort, scale.ClusterCIDR),
			fmt.Sprintf("-A %s -m comment --comment \"%s -> %s:%d\" -j %s\n", svc, pn, ep, d.podPort, sep),
			fmt.Sprintf("-A %s -m comment --comment \"masquerade traffic for %s external destinations\" -j KUBE-MARK-MASQ\n", ext, pn),
			fmt.Sprintf("-A %s -j %s\n", ext, svc),
			fmt.Sprintf("-A %s -m comment --comment %s -s %s/32 -j KUBE-MARK-MASQ\n", sep, pn, ep),
			fmt.Sprintf("-A %s -m comment --comment %s %s -j DNAT --to-destination %s:%d\n", sep, pn, m, ep, d.podPort),
		)
	}
	var svcIdx, npIdx []int
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "-A KUBE-SERVICES ") && !strings.Contains(l, "-j KUBE-NODEPORTS"):
			svcIdx = append(svcIdx, i)
		case strings.HasPrefix(l, "-A KUBE-NODEPORTS "):
			npIdx = append(npIdx, i)
		}
	}
	mid := func(idx []int, fallback int) int {
		if len(idx) == 0 {
			return fallback
		}
		return idx[len(idx)/2]
	}
	prerouting := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "-A PREROUTING ") })
	nat := slices.Index(lines, "*nat\n")
	// Lines inserted before line i of the generated rule set: the chain
	// declarations after "*nat" (the filter table comes first), the
	// jumps in the middle of their chains, the measured services' own
	// chains before the built-in chains' jumps at the end.
	at := map[int][]string{}
	at[nat+1] = append(at[nat+1], decl...)
	at[mid(svcIdx, prerouting)] = append(at[mid(svcIdx, prerouting)], svcRules...)
	at[mid(npIdx, prerouting)] = append(at[mid(npIdx, prerouting)], npRules...)
	at[prerouting] = append(at[prerouting], rest...)
	var w strings.Builder
	for i, l := range lines {
		for _, x := range at[i] {
			w.WriteString(x)
		}
		w.WriteString(l)
	}
	return w.String()
}

// dpOptions are the data-path mode's options as the report records them.
type dpOptions struct {
	Run           time.Duration `json:"run"`
	Warmup        time.Duration `json:"warmup"`
	Repeat        int           `json:"repeat"`
	Clients       int           `json:"clients"`
	ServerThreads int           `json:"server_threads"`
	Flows         int           `json:"flows"`
	NAPI          bool          `json:"napi"`
	SenderCPU     int           `json:"sender_cpu"`
}

// DatapathReport is a data-path run.
type DatapathReport struct {
	// Kind is "datapath": --from tells the results files apart by it.
	Kind     string    `json:"kind"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Command  string    `json:"command"`
	Machine  Machine   `json:"machine"`
	Options  dpOptions `json:"options"`
	Cases    []*DPCase `json:"cases"`
}

// DPCase is one path at one size: its runs, one per round.
type DPCase struct {
	Path  string `json:"path"`
	Label string `json:"label"`
	Size  Size   `json:"size"`
	// Status is "ok", "unavailable" (the backend lacks the path's
	// option), "unsupported" (this machine cannot run it), "cut" or
	// "error".
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// SetupSeconds is the dataplane's first sync (or the reference's
	// load).
	SetupSeconds float64      `json:"setup_seconds,omitempty"`
	TCP          []*crrResult `json:"tcp,omitempty"`
	UDP          []*udpResult `json:"udp,omitempty"`
	// UDPSink are the UDP runs with node2's XDP sink: what node1 alone
	// forwarded.
	UDPSink []*udpResult `json:"udp_sink,omitempty"`
	// Errors are the runs that failed.
	Errors []string `json:"errors,omitempty"`
}

func (c *DPCase) ok() bool { return c.Status == "ok" }

// dpLive is a path set up at one size: its namespaces, dataplane and
// server, kept while the rounds run.
type dpLive struct {
	path    dpPath
	c       *DPCase
	t       *testnet.Topology
	wire    *wireLike
	proxier *child // nil for direct and the references
	// node2 is node2's proxier on a DSR path, else nil.
	node2  *child
	server *child
	// cg and cg2 are the empty cgroups of node1's and node2's eBPF
	// socket programs.
	cg, cg2 string
	dstTCP  netip.AddrPort
	dstUDP  netip.AddrPort
	srcMAC  string
	dstMAC  string
}

// runDatapath runs the data-path mode and writes its report.
func runDatapath(ctx context.Context, o Options) (*DatapathReport, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r := &runner{o: o, exe: exe, start: time.Now()}
	r.deadline = r.start.Add(o.TimeLimit)
	r.iptFlavour = hostIPTablesFlavour()
	r.cgroup2, _ = cgroup2.Mount()
	rep := &DatapathReport{Kind: "datapath", Started: r.start, Command: o.Command, Machine: describeMachine()}
	rep.Options = dpOptions{Run: o.DPRun, Warmup: o.DPWarmup, Repeat: o.DPRepeat, Clients: o.DPClients,
		ServerThreads: o.DPServerThreads, Flows: o.DPFlows, NAPI: o.DPNAPI, SenderCPU: o.DPSenderCPU}
	var paths []dpPath
	for _, n := range o.Paths {
		p, _ := dpPathByName(n)
		paths = append(paths, p)
	}
	for _, sz := range o.Sizes {
		var live []*dpLive
		for _, p := range paths {
			c := &DPCase{Path: p.Name, Label: p.Label, Size: sz}
			rep.Cases = append(rep.Cases, c)
			switch {
			case ctx.Err() != nil:
				c.Status, c.Reason = "cut", "interrupted"
			case time.Until(r.deadline) < o.DPRun*time.Duration(dpRunsPerRound*o.DPRepeat):
				c.Status, c.Reason = "cut", fmt.Sprintf("not enough left of --time-limit=%v", o.TimeLimit)
			default:
				r.logf("data path %s %s: set-up ...", c.Label, sz)
				if l := r.dpSetup(ctx, p, c); l != nil {
					live = append(live, l)
					r.logf("data path %s %s: set up in %s", c.Label, sz, seconds(c.SetupSeconds))
					continue
				}
			}
			r.logf("data path %s %s: %s: %s", c.Label, sz, c.Status, c.Reason)
		}
		for round := range o.DPRepeat {
			for i := range live {
				if ctx.Err() != nil || time.Now().After(r.deadline) {
					break
				}
				l := live[(i+round)%len(live)]
				r.dpMeasure(ctx, l)
			}
		}
		for _, l := range live {
			r.dpTeardown(l)
			c := l.c
			switch {
			case len(c.TCP) > 0 || len(c.UDP) > 0 || len(c.UDPSink) > 0:
				c.Status = "ok"
			case ctx.Err() != nil:
				c.Status, c.Reason = "cut", "interrupted"
			case len(c.Errors) > 0:
				c.Status, c.Reason = "error", c.Errors[0]
			default:
				c.Status, c.Reason = "cut", fmt.Sprintf("stopped at --time-limit=%v", o.TimeLimit)
			}
			r.logf("data path %s %s: %s", c.Label, c.Size, c.summary())
		}
	}
	rep.Finished = time.Now()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	rep.Machine.LoadEnd = loadAvg()
	rep.Machine.Note = o.Note
	return rep, writeDatapath(rep, o)
}

// dpSetup builds a path's namespaces, starts the server in the endpoint
// pod and programs node1. It returns nil, with the case's status set,
// when the path cannot be measured.
func (r *runner) dpSetup(ctx context.Context, p dpPath, c *DPCase) *dpLive {
	switch {
	case p.Backend != "":
		if reason := r.backendPrecondition(p.Backend); reason != "" {
			c.Status, c.Reason = "unsupported", reason
			return nil
		}
	case p.Ref != "":
		if _, err := exec.LookPath(r.loader(p.Ref).argv[0]); err != nil {
			c.Status, c.Reason = "unsupported", fmt.Sprintf("no %s installed", r.loader(p.Ref).argv[0])
			return nil
		}
	}
	cctx, cancel := r.caseContext(ctx)
	defer cancel()
	t, err := testnet.Build(testnet.Options{Node1Pods: 1, Node2Pods: 1, ClientToNode2: p.dsr()})
	if err != nil {
		c.Status, c.Reason = "error", oneLine(err.Error())
		return nil
	}
	l := &dpLive{path: p, c: c, t: t}
	ok := false
	defer func() {
		if !ok {
			r.dpTeardown(l)
		}
	}()
	fail := func(err error) *dpLive {
		switch {
		case ctx.Err() != nil:
			c.Status, c.Reason = "cut", "interrupted"
		case cctx.Err() != nil:
			c.Status, c.Reason = "cut", "set-up stopped: ran past --time-limit or far past --case-limit"
		default:
			c.Status, c.Reason = "error", oneLine(err.Error())
		}
		return nil
	}
	pod := t.Node2.Pods[0]
	if p.Name == "direct" {
		l.dstTCP, l.dstUDP = netip.AddrPortFrom(pod.IPv4, dpTCPPort), netip.AddrPortFrom(pod.IPv4, dpUDPPort)
	} else {
		ext := t.Node1.ExternalIPv4
		l.dstTCP, l.dstUDP = netip.AddrPortFrom(ext, dpTCPNodePort), netip.AddrPortFrom(ext, dpUDPNodePort)
	}
	// Many short connections: a wide ephemeral port range.
	if err := t.Client.SetSysctl("net/ipv4/ip_local_port_range", "10000 65000"); err != nil {
		return fail(err)
	}
	if l.srcMAC, err = macOf(t.Client.NS, "eth0"); err != nil {
		return fail(err)
	}
	if l.dstMAC, err = macOf(t.Node1.NS, "client"); err != nil {
		return fail(err)
	}
	if l.wire, err = makeWireLike(t); err != nil {
		return fail(err)
	}
	if r.o.DPNAPI {
		// node1 receives from the client in a kernel thread of its own
		// (threaded NAPI, which a veth does with GRO on): its whole
		// receive path (XDP, tc, netfilter, forwarding, and node2's and
		// the pod's after it) runs there, not in the sender's system
		// calls, and a full receive ring pushes back on the sender
		// instead of dropping.
		if err := setGRO(t.Node1.NS, "client", true); err != nil {
			return fail(err)
		}
		if err := setSysfs(t.Node1.NS, "client", "threaded", "1"); err != nil {
			return fail(err)
		}
	}
	l.server, err = r.startChild(context.Background(), roleCRRServer, "crr-server", crrServerParams{NetNS: pod.Path(), Port: dpTCPPort, Threads: r.o.DPServerThreads})
	if err != nil {
		return fail(err)
	}
	if _, err := l.server.read(); err != nil {
		return fail(fmt.Errorf("server: %w", err))
	}
	switch {
	case p.Backend != "":
		pp := dpProxierParams{Backend: p.Backend, EBPF: p.EBPF, NetNS: t.Node1.Path(), Size: c.Size, Endpoint: pod.IPv4, XDPCounters: p.xdp()}
		switch p.Backend {
		case "iptables-nft":
			pp.IPTMode = "nft"
		case "iptables-legacy":
			pp.IPTMode = "legacy"
		case "iptables":
			pp.IPTMode = r.iptFlavour
		}
		if strings.HasPrefix(p.Backend, "ebpf") {
			if l.cg, err = dpCgroup(r.cgroup2, t.ID); err != nil {
				return fail(err)
			}
			pp.Cgroup = l.cg
		}
		res, err := r.dpStartProxier(cctx, &l.proxier, p.Name+" "+c.Size.String(), pp)
		if err != nil {
			return fail(err)
		}
		if !dpProxierUp(c, res) {
			return nil
		}
		c.SetupSeconds = res.SyncSeconds
		if p.dsr() {
			// node2 unwraps what node1 sends it: a backend of its own
			// with the measured services alone, whose endpoint is its
			// pod (local there).
			if l.cg2, err = dpCgroup(r.cgroup2, t.ID+"-node2"); err != nil {
				return fail(err)
			}
			p2 := dpProxierParams{Backend: p.Backend, EBPF: p.node2EBPF(), NetNS: t.Node2.Path(), NodeName: testnet.Node2Name,
				PodNetNS: []string{pod.Path()}, Cgroup: l.cg2, Endpoint: pod.IPv4}
			res, err := r.dpStartProxier(cctx, &l.node2, p.Name+" node2", p2)
			if err != nil {
				return fail(fmt.Errorf("node2: %w", err))
			}
			if !dpProxierUp(c, res) {
				c.Reason = "node2: " + c.Reason
				return nil
			}
		}
	case p.Ref != "":
		filler := dpFiller(c.Size)
		var script string
		if p.Ref == refNFT {
			script = dpKubeProxyNFT(filler, pod.IPv4)
		} else {
			script = dpKubeProxyIPTables(filler, pod.IPv4)
		}
		f, err := os.CreateTemp("", "proxykit-bench-dp-")
		if err != nil {
			return fail(err)
		}
		defer os.Remove(f.Name())
		_, err = f.WriteString(script)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err)
		}
		d, _, err := r.load(cctx, t.Node1.NS, r.loader(p.Ref), f.Name())
		if err != nil {
			return fail(fmt.Errorf("load: %w", err))
		}
		c.SetupSeconds = d.Seconds()
	}
	ok = true
	return l
}

// dpStartProxier starts a data-path proxier child into *ch (which
// teardown stops) and reads its first result within ctx. The proxier
// lives as long as the path: it is not bound to ctx.
func (r *runner) dpStartProxier(ctx context.Context, ch **child, name string, p dpProxierParams) (childResult, error) {
	var err error
	if *ch, err = r.startChild(context.Background(), roleDPProxier, name, p); err != nil {
		return childResult{}, err
	}
	return readWithin(ctx, *ch)
}

// dpProxierUp says a proxier child's first result is a sync, else sets
// the case's status from it: its backend lacks the path's option, or
// this machine cannot run it.
func dpProxierUp(c *DPCase, res childResult) bool {
	switch {
	case res.Unavailable != "":
		c.Status, c.Reason = "unavailable", oneLine(res.Unavailable)
		return false
	case res.Unsupported != "":
		c.Status, c.Reason = "unsupported", oneLine(res.Unsupported)
		return false
	}
	return true
}

// dpCgroup makes an empty cgroup for a proxier's eBPF socket programs
// under the cgroup2 mount root.
func dpCgroup(root, id string) (string, error) {
	cg := filepath.Join(root, "proxykit-bench-"+id)
	if err := os.Mkdir(cg, 0o755); err != nil {
		return "", err
	}
	return cg, nil
}

// readWithin reads the child's next result, killing it when ctx ends
// first.
func readWithin(ctx context.Context, ch *child) (childResult, error) {
	type res struct {
		r   childResult
		err error
	}
	rc := make(chan res, 1)
	go func() {
		r, err := ch.read()
		rc <- res{r, err}
	}()
	select {
	case x := <-rc:
		return x.r, x.err
	case <-ctx.Done():
		ch.kill()
		<-rc
		return childResult{}, ctx.Err()
	}
}

// macOf returns the hardware address of an interface of a namespace.
func macOf(ns *testnet.NS, device string) (string, error) {
	var mac string
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(device)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr.String()
		return nil
	})
	return mac, err
}

// dpXDP reads node1's XDP counters from the path's proxier.
func dpXDP(l *dpLive) (xdpCounts, error) {
	if _, err := l.proxier.stdin.Write([]byte("xdp\n")); err != nil {
		return xdpCounts{}, fmt.Errorf("XDP counters: %w", err)
	}
	res, err := l.proxier.read()
	if err != nil {
		return xdpCounts{}, fmt.Errorf("XDP counters: %w", err)
	}
	if res.XDP == nil {
		return xdpCounts{}, errors.New("XDP counters: none")
	}
	return *res.XDP, nil
}

// dpXDPStart returns a function that, at the end of a run, returns
// what node1's XDP program did since dpXDPStart: nil on a path without
// one, an error when XDP did not do the path's work (xdpCounts.check).
func dpXDPStart(l *dpLive) func() (*xdpCounts, error) {
	end := dpAround(l.path.xdp(), func() (xdpCounts, error) { return dpXDP(l) }, xdpCounts.sub)
	return func() (*xdpCounts, error) {
		d, err := end()
		if err == nil && d != nil {
			err = d.check(l.path.dsr())
		}
		return d, err
	}
}

// dpAround reads counters now (when on) and returns a function that, at
// the end of a run, reads them again and returns their increase (sub of
// the end and the start), nil when not on.
func dpAround[T any](on bool, read func() (T, error), sub func(end, start T) T) func() (*T, error) {
	if !on {
		return func() (*T, error) { return nil, nil }
	}
	c0, err0 := read()
	return func() (*T, error) {
		if err0 != nil {
			return nil, err0
		}
		c1, err := read()
		if err != nil {
			return nil, err
		}
		d := sub(c1, c0)
		return &d, nil
	}
}

// check reports an XDP run that did not do the path's work: on a DSR
// path XDP passes every flow to tc (which wraps it) and must have seen
// them; elsewhere it must have redirected packets, else tc did the work
// and the figures are tc's.
func (x xdpCounts) check(dsr bool) error {
	switch {
	case dsr && x.Total() == 0:
		return errors.New("XDP saw no packet: it was not in front of tc")
	case !dsr && x.Redirect == 0:
		return fmt.Errorf("XDP redirected nothing (%d sent back out, %d passed to tc): tc did the work", x.TX, x.Pass)
	}
	return nil
}

// dsrCounts are the packets that came from node2 during a run of a DSR
// path: to the client over its own link (received on the client's
// eth1), and to node1 (received on node1's interface toward node2).
type dsrCounts struct {
	ToClient uint64 `json:"to_client"`
	ToNode1  uint64 `json:"to_node1"`
}

// describe is the counters for a log line, empty for nil.
func (d *dsrCounts) describe() string {
	if d == nil {
		return ""
	}
	return fmt.Sprintf("; from node2: %d packets to the client, %d to node1", d.ToClient, d.ToNode1)
}

// checkTCP reports a TCP_CRR run of a DSR path whose replies did not
// go from node2 to the client directly: every transaction has several
// packets from the endpoint, none of which should pass node1.
func (d dsrCounts) checkTCP() error {
	if d.ToClient == 0 || d.ToNode1 >= d.ToClient {
		return fmt.Errorf("replies came back through node1 (%d packets node2 -> node1, %d node2 -> client): not direct server return", d.ToNode1, d.ToClient)
	}
	return nil
}

// dpDSRStart returns a function that, at the end of a run, returns the
// packets that came from node2 since dpDSRStart: nil on a path without
// direct server return.
func dpDSRStart(l *dpLive) func() (*dsrCounts, error) {
	refs := []counterRef{
		{Name: "to-client", NetNS: l.t.Client.Path(), Device: "eth1"},
		{Name: "to-node1", NetNS: l.t.Node1.Path(), Device: testnet.Node2Name},
	}
	read := func() (dsrCounts, error) {
		c, err := readCounters(refs)
		return dsrCounts{ToClient: c["to-client"].RxPackets, ToNode1: c["to-node1"].RxPackets}, err
	}
	return dpAround(l.path.dsr(), read, dsrCounts.sub)
}

// sub returns the increase from b to d.
func (d dsrCounts) sub(b dsrCounts) dsrCounts {
	return dsrCounts{ToClient: d.ToClient - b.ToClient, ToNode1: d.ToNode1 - b.ToNode1}
}

// dpRunsPerRound are the runs of a path in a round: TCP_CRR, UDP at
// the endpoint, UDP with node2's sink.
const dpRunsPerRound = 3

// dpMeasure makes one round of a path: a TCP_CRR run, a UDP run to the
// endpoint and a UDP run into node2's XDP sink. On a path with XDP, a
// run in which XDP did not do the path's work failed; on a path with
// direct server return, a TCP_CRR run whose replies came back through
// node1.
func (r *runner) dpMeasure(ctx context.Context, l *dpLive) {
	c, t := l.c, l.t
	bound := dpRunsPerRound*(r.o.DPWarmup+r.o.DPRun) + 30*time.Second
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	xdpEnd, dsrEnd := dpXDPStart(l), dpDSRStart(l)
	ch, err := r.startChild(cctx, roleCRRClient, "crr-client", crrClientParams{
		NetNS: t.Client.Path(), Dst: l.dstTCP, Clients: r.o.DPClients,
		WarmupMS: r.o.DPWarmup.Milliseconds(), RunMS: r.o.DPRun.Milliseconds(),
	})
	if err == nil {
		var res childResult
		if res, err = ch.read(); err == nil {
			err = ch.wait()
		}
		ch.kill()
		if err == nil {
			res.CRR.XDP, err = xdpEnd()
		}
		if err == nil {
			if res.CRR.DSR, err = dsrEnd(); err == nil && res.CRR.DSR != nil {
				err = res.CRR.DSR.checkTCP()
			}
		}
		if err == nil {
			c.TCP = append(c.TCP, res.CRR)
			r.logf("data path %s %s: TCP_CRR %.0f/s, p50 %.0f µs, p99 %.0f µs, %d errors%s%s", c.Label, c.Size, res.CRR.PerSec, res.CRR.Latency.Median, res.CRR.Latency.P99, res.CRR.Errors, res.CRR.XDP.describe(), res.CRR.DSR.describe())
		}
	}
	if err != nil {
		c.Errors = append(c.Errors, oneLine("TCP_CRR: "+err.Error()))
		r.logf("data path %s %s: TCP_CRR: %v", c.Label, c.Size, err)
	}
	time.Sleep(200 * time.Millisecond)

	r.dpUDP(cctx, l, false)
	r.dpUDP(cctx, l, true)
}

// sinkLeak is how many packets the endpoint may receive in a run into
// node2's sink: none of the datagrams, but node2's neighbour probes of
// the pod (a pass through the sink is a failed run).
const sinkLeak = 10

// dpUDP makes one UDP run of a path: to the endpoint or, with sink,
// into node2's XDP sink (which is switched on for the run). A run to
// the endpoint fails when nothing reached it; one into the sink when
// the sink counted nothing or datagrams passed it.
func (r *runner) dpUDP(ctx context.Context, l *dpLive, sink bool) {
	c, t := l.c, l.t
	what := "UDP"
	if sink {
		what = "UDP into node2's sink"
	}
	p := udpSenderParams{
		NetNS: t.Client.Path(), Device: "eth0", SrcMAC: l.srcMAC, DstMAC: l.dstMAC,
		Src: t.Client.IPv4, Dst: l.dstUDP, Flows: r.o.DPFlows, CPU: r.o.DPSenderCPU,
		WarmupMS: r.o.DPWarmup.Milliseconds(), RunMS: r.o.DPRun.Milliseconds(),
		Counters: []counterRef{
			{Name: "client", NetNS: t.Client.Path(), Device: "eth0"},
			{Name: "node1-in", NetNS: t.Node1.Path(), Device: "client"},
			{Name: "node1-out", NetNS: t.Node1.Path(), Device: testnet.Node2Name},
			{Name: "endpoint", NetNS: t.Node2.Pods[0].Path(), Device: "eth0"},
		},
	}
	err := r.dpUDPRun(ctx, l, p, sink)
	if err != nil {
		c.Errors = append(c.Errors, oneLine(what+": "+err.Error()))
		r.logf("data path %s %s: %s: %v", c.Label, c.Size, what, err)
	}
	time.Sleep(200 * time.Millisecond)
}

// dpUDPRun runs the UDP sender with p and records its result in the
// path's case, or returns why the run failed.
func (r *runner) dpUDPRun(ctx context.Context, l *dpLive, p udpSenderParams, sink bool) (err error) {
	c := l.c
	if sink {
		if p.SinkMapID, err = l.wire.sink.mapID(); err != nil {
			return err
		}
		if err := l.wire.sinkOn(true); err != nil {
			return err
		}
		defer func() {
			if oerr := l.wire.sinkOn(false); err == nil {
				err = oerr
			}
		}()
	}
	xdpEnd, dsrEnd := dpXDPStart(l), dpDSRStart(l)
	ch, err := r.startChild(ctx, roleUDPSender, "udp-sender", p)
	if err != nil {
		return err
	}
	res, err := ch.read()
	if err == nil {
		err = ch.wait()
	}
	ch.kill()
	if err != nil {
		return err
	}
	if sink {
		err = res.UDP.checkSink()
	} else if res.UDP.Counters["endpoint"].RxPackets == 0 {
		err = fmt.Errorf("no datagram reached the endpoint (%d sent)", res.UDP.Sent)
	}
	if err != nil {
		return err
	}
	if res.UDP.XDP, err = xdpEnd(); err != nil {
		return err
	}
	u := udpFigures(res.UDP)
	if sink {
		c.UDPSink = append(c.UDPSink, res.UDP)
		r.logf("data path %s %s: UDP offered %.0f/s, forwarded by node1 into node2's sink %.0f/s (node1's interface counted %.0f/s)%s", c.Label, c.Size, u.Offered, u.Sink, u.Forwarded, res.UDP.XDP.describe())
		return nil
	}
	// Nothing answers the datagrams but the pod's ICMP port
	// unreachable (rate-limited): counted, not checked.
	if res.UDP.DSR, err = dsrEnd(); err != nil {
		return err
	}
	c.UDP = append(c.UDP, res.UDP)
	r.logf("data path %s %s: UDP offered %.0f/s, at the endpoint %.0f/s, node1 dropped %.1f%%%s%s", c.Label, c.Size, u.Offered, u.Endpoint, 100*u.Node1Drop, res.UDP.XDP.describe(), res.UDP.DSR.describe())
	return nil
}

// checkSink reports a run into node2's sink that did not measure what
// node1 forwarded: the sink counted nothing (it was not there, or node1
// forwarded nothing), or datagrams passed it to the endpoint.
func (u *udpResult) checkSink() error {
	switch {
	case u.Sink == nil || *u.Sink == 0:
		return fmt.Errorf("node2's sink counted nothing (%d sent, %d to the endpoint)", u.Sent, u.Counters["endpoint"].RxPackets)
	case u.Counters["endpoint"].RxPackets > sinkLeak:
		return fmt.Errorf("%d packets passed node2's sink to the endpoint (the sink counted %d)", u.Counters["endpoint"].RxPackets, *u.Sink)
	}
	return nil
}

// dpTeardown stops a path's children and removes its namespaces.
func (r *runner) dpTeardown(l *dpLive) {
	for _, ch := range []*child{l.proxier, l.node2} {
		if ch == nil {
			continue
		}
		ch.stdin.Write([]byte("done\n"))
		done := make(chan struct{})
		go func() {
			ch.read()
			ch.wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			ch.kill()
			<-done
		}
	}
	if l.server != nil {
		l.server.kill()
	}
	if l.wire != nil {
		if err := l.wire.Close(); err != nil {
			r.logf("teardown: %v", err)
		}
	}
	r.flushRuleset(l.t)
	if err := l.t.Close(); err != nil {
		r.logf("teardown: %v", err)
	}
	for _, cg := range []string{l.cg, l.cg2} {
		if cg != "" {
			removeCgroup(cg)
		}
	}
}

func (c *DPCase) summary() string {
	if !c.ok() {
		return c.Status + ": " + c.Reason
	}
	f := dpCaseFigures(c)
	return fmt.Sprintf("TCP_CRR %.0f/s (p50 %.0f µs, p99 %.0f µs), UDP %.0f/s at the endpoint, %.0f/s forwarded by node1 (node2 drops at XDP), median of %d/%d/%d runs",
		f.TCP.PerSec, f.TCP.P50, f.TCP.P99, f.UDP.Endpoint, f.Sink.Forwarded, len(c.TCP), len(c.UDP), len(c.UDPSink))
}

// setGRO turns generic receive offload of a namespace's interface on or
// off. On a veth it also switches the receiving side to NAPI, which
// threaded NAPI needs.
func setGRO(ns *testnet.NS, device string, on bool) error {
	return ethtoolSet(ns, device, ethtoolSGRO, on)
}

// setSysfs writes a file of /sys/class/net/DEVICE in namespace ns
// (sysfs shows a namespace's devices only to a sysfs mounted in it,
// which `ip netns exec` does).
func setSysfs(ns *testnet.NS, device, file, value string) error {
	out, err := exec.Command("ip", "netns", "exec", ns.Name(), "sh", "-c",
		fmt.Sprintf("echo %s > /sys/class/net/%s/%s", value, device, file)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s of %s: %w: %s", file, device, err, strings.TrimSpace(string(out)))
	}
	return nil
}
