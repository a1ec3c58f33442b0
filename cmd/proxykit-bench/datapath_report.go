package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/proxykit/proxykit/cmd/proxykit-bench/internal/plot"
)

// Files of the data-path mode, in Options.PlotDir.
const (
	datapathJSON   = "datapath.json"
	plotDPTCP      = "datapath-tcp-crr.svg"
	plotDPUDP      = "datapath-udp-pps.svg"
	plotDPUDPNode1 = "datapath-udp-node1.svg"
	datapathAnchor = "data-path-throughput"
)

// datapathMarker begins the data-path section of the report. The
// report is three parts: the scale run's figures, from the top; the
// data-path section, from this line; the hand-written sections, from
// handWritten. Each mode writes its own part and keeps the others.
const datapathMarker = "<!-- data-path section: written by proxykit-bench --datapath, kept by its other runs -->"

// splitReport returns the generated parts of a report: the scale run's
// part and the data-path section (from datapathMarker, empty without
// one), both before the hand-written sections.
func splitReport(md string) (scaleRun, datapath string) {
	end := len(md)
	if i := strings.Index(md, handWritten); i >= 0 {
		end = i
	}
	gen := md[:end]
	if i := strings.Index(gen, datapathMarker); i >= 0 {
		return gen[:i], gen[i:]
	}
	return gen, ""
}

// composeReport returns the report with the scale run's part scaleRun
// and the data-path section datapath; an empty one is taken from the old
// report, and so are the hand-written sections.
func composeReport(scaleRun, datapath, old string) string {
	oldScale, oldDP := splitReport(old)
	if scaleRun == "" {
		scaleRun = oldScale
	}
	if datapath == "" {
		datapath = oldDP
	}
	if strings.TrimSpace(scaleRun) == "" {
		scaleRun = "# Benchmarks\n"
	}
	md := strings.TrimRight(scaleRun, "\n") + "\n"
	if strings.TrimSpace(datapath) != "" {
		md += "\n" + strings.TrimRight(datapath, "\n") + "\n"
	}
	return keepHandWritten(md, old)
}

// writeDatapath writes the data-path results, their plots and their
// section of the report.
func writeDatapath(rep *DatapathReport, o Options) error {
	return writeOutputs(o, datapathJSON, rep,
		func(dir string) error { return writeDatapathPlots(rep, dir) },
		func(old string) string { return composeReport("", datapathMarkdown(rep, o), old) })
}

// udpFig are the figures of one UDP run, per second.
type udpFig struct {
	// Offered is what the client's interface handed to node1's (taken
	// or dropped at its entry); Forwarded what node1 sent toward
	// node2; Endpoint what reached the pod.
	Offered, Forwarded, Endpoint float64
	// Node1Drop is the share of the offered packets node1 did not
	// forward: dropped on their way in (a full backlog) or inside it.
	Node1Drop float64
	// Sink is, in a run into node2's XDP sink, what the sink counted:
	// what node1 forwarded toward node2.
	Sink float64
}

func udpFigures(u *udpResult) udpFig {
	if u == nil || u.Seconds <= 0 {
		return udpFig{}
	}
	f := udpFig{
		Offered:   float64(u.Counters["client"].TxPackets+u.Counters["client"].TxDropped) / u.Seconds,
		Forwarded: float64(u.Counters["node1-out"].TxPackets) / u.Seconds,
		Endpoint:  float64(u.Counters["endpoint"].RxPackets) / u.Seconds,
	}
	if f.Offered > 0 {
		f.Node1Drop = max(0, 1-f.Forwarded/f.Offered)
	}
	if u.Sink != nil {
		f.Sink = float64(*u.Sink) / u.Seconds
	}
	return f
}

// dpFig are a case's figures: medians over its runs.
type dpFig struct {
	TCP struct {
		PerSec, P50, P99 float64
		// Min and Max are the lowest and highest run's PerSec.
		Min, Max  float64
		Errors, N int
	}
	UDP struct {
		udpFig
		// Min and Max are the lowest and highest run's Endpoint.
		Min, Max float64
		N        int
	}
	// Sink are the runs into node2's XDP sink: Forwarded is what the
	// sink counted (what node1 alone forwarded), Offered what the
	// client's interface handed to node1's.
	Sink struct {
		Forwarded, Offered float64
		// Min and Max are the lowest and highest run's Forwarded.
		Min, Max float64
		N        int
	}
}

// spread formats the median v of runs from lo to hi, with the range
// when there are several runs.
func spread(v, lo, hi float64, n int) string {
	if n < 2 || v <= 0 {
		return rate(v)
	}
	return fmt.Sprintf("%s (%s–%s)", rate(v), rate(lo), rate(hi))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func dpCaseFigures(c *DPCase) dpFig {
	var f dpFig
	var rate, p50, p99 []float64
	for _, r := range c.TCP {
		if r == nil {
			continue
		}
		rate, p50, p99 = append(rate, r.PerSec), append(p50, r.Latency.Median), append(p99, r.Latency.P99)
		f.TCP.Errors += r.Errors
	}
	f.TCP.PerSec, f.TCP.P50, f.TCP.P99, f.TCP.N = median(rate), median(p50), median(p99), len(rate)
	if len(rate) > 0 {
		f.TCP.Min, f.TCP.Max = slices.Min(rate), slices.Max(rate)
	}
	var off, fwd, ep, drop []float64
	for _, r := range c.UDP {
		u := udpFigures(r)
		off, fwd, ep, drop = append(off, u.Offered), append(fwd, u.Forwarded), append(ep, u.Endpoint), append(drop, u.Node1Drop)
	}
	f.UDP.Offered, f.UDP.Forwarded, f.UDP.Endpoint, f.UDP.Node1Drop, f.UDP.N = median(off), median(fwd), median(ep), median(drop), len(ep)
	if len(ep) > 0 {
		f.UDP.Min, f.UDP.Max = slices.Min(ep), slices.Max(ep)
	}
	var sink, sinkOff []float64
	for _, r := range c.UDPSink {
		u := udpFigures(r)
		sink, sinkOff = append(sink, u.Sink), append(sinkOff, u.Offered)
	}
	f.Sink.Forwarded, f.Sink.Offered, f.Sink.N = median(sink), median(sinkOff), len(sink)
	if len(sink) > 0 {
		f.Sink.Min, f.Sink.Max = slices.Min(sink), slices.Max(sink)
	}
	return f
}

// dpSizes returns the sizes of the report's cases in run order.
func dpSizes(rep *DatapathReport) []Size {
	var out []Size
	for _, c := range rep.Cases {
		if !slices.Contains(out, c.Size) {
			out = append(out, c.Size)
		}
	}
	return out
}

// dpFind returns the measured case of path at size, or nil.
func dpFind(rep *DatapathReport, path string, sz Size) *DPCase {
	for _, c := range rep.Cases {
		if c.Path == path && c.Size == sz && c.ok() {
			return c
		}
	}
	return nil
}

// ratio formats a/b as a multiple, "—" when either is missing.
func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// rate formats a per-second figure.
func rate(v float64) string {
	switch {
	case v <= 0:
		return "—"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// datapathMarkdown renders the data-path section.
func datapathMarkdown(rep *DatapathReport, o Options) string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	m, op := rep.Machine, rep.Options
	p("%s\n\n", datapathMarker)
	p("## Data-path throughput\n\n")
	p("What a packet costs on each path, as opposed to what programming the kernel costs (the\n")
	p("sections above): a client outside the cluster sends traffic to a node port of node1, whose\n")
	p("one endpoint is a pod behind node2, with the size's services loaded into node1's dataplane\n")
	p("besides. Written by `cmd/proxykit-bench --datapath`")
	if o.PlotDir != "" {
		p(" (raw figures: [`%s`](%s))", datapathJSON, reportLink(o, datapathJSON))
	}
	p(":\n\n    %s\n\n", rep.Command)
	p("- Run %s, %s in all; %s, %d logical CPUs; kernel %s; %s.\n", rep.Started.UTC().Format("2006-01-02 15:04 MST"),
		rep.Finished.Sub(rep.Started).Round(time.Second), m.CPU, m.CPUs, m.Kernel, m.Go)
	p("- Load average (1, 5, 15 min) at the start: %s; at the end: %s.\n", m.LoadStart, m.LoadEnd)
	if m.Source != "" {
		p("- Source: `%s` (git describe).\n", m.Source)
	}
	if m.Note != "" {
		p("- %s\n", m.Note)
	}
	p("- Each round runs every path once, in a rotating order; %d rounds, each run %v after a %v warm-up;\n", op.Repeat, op.Run, op.Warmup)
	p("  the tables show medians over the rounds (the lowest and highest run in parentheses). Ratios\n")
	p("  compare the medians of paths of one size within this run.\n\n")

	var notes []string
	note := func(s string) int {
		if i := slices.Index(notes, s); i >= 0 {
			return i + 1
		}
		notes = append(notes, s)
		return len(notes)
	}
	for _, sz := range dpSizes(rep) {
		direct, nft := dpFind(rep, "direct", sz), dpFind(rep, "nftables", sz)
		var dTCP, dUDP, nUDP, dSink, nSink float64
		if direct != nil {
			f := dpCaseFigures(direct)
			dTCP, dUDP, dSink = f.TCP.PerSec, f.UDP.Endpoint, f.Sink.Forwarded
		}
		if nft != nil {
			f := dpCaseFigures(nft)
			nUDP, nSink = f.UDP.Endpoint, f.Sink.Forwarded
		}
		p("### %s services × %d endpoint(s), plus the measured services\n\n", thousands(sz.Services), sz.Endpoints)
		p("| path | TCP_CRR conn/s | × direct | latency p50 / p99 | UDP pkt/s at the endpoint | × direct | × nftables | node1 drops | offered pkt/s | UDP pkt/s forwarded by node1 (node2 drops at XDP) | × direct | × nftables | set-up |\n")
		p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range rep.Cases {
			if c.Size != sz {
				continue
			}
			if !c.ok() {
				what := map[string]string{"unavailable": "not available", "unsupported": "not measured here", "cut": "cut", "error": "failed"}[c.Status]
				if what == "" {
					what = "not measured"
				}
				p("| %s | %s [%d] | | | | | | | | | | | |\n", c.Label, what, note(c.Reason))
				continue
			}
			f := dpCaseFigures(c)
			lat := "—"
			if f.TCP.N > 0 {
				lat = micros(f.TCP.P50) + " / " + micros(f.TCP.P99)
			}
			tcp := spread(f.TCP.PerSec, f.TCP.Min, f.TCP.Max, f.TCP.N)
			if f.TCP.Errors > 0 {
				tcp += fmt.Sprintf(" (%d failed)", f.TCP.Errors)
			}
			if len(c.Errors) > 0 {
				tcp += fmt.Sprintf(" [%d]", note(fmt.Sprintf("%s, %s: %d of %d runs failed, the first: %s", c.Label, sz, len(c.Errors), dpRunsPerRound*op.Repeat, c.Errors[0])))
			}
			drop := "—"
			if f.UDP.N > 0 {
				drop = fmt.Sprintf("%.1f%%", 100*f.UDP.Node1Drop)
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Label, tcp, ratio(f.TCP.PerSec, dTCP), lat,
				spread(f.UDP.Endpoint, f.UDP.Min, f.UDP.Max, f.UDP.N), ratio(f.UDP.Endpoint, dUDP), ratio(f.UDP.Endpoint, nUDP), drop, rate(f.UDP.Offered),
				spread(f.Sink.Forwarded, f.Sink.Min, f.Sink.Max, f.Sink.N), ratio(f.Sink.Forwarded, dSink), ratio(f.Sink.Forwarded, nSink), seconds(c.SetupSeconds))
		}
		p("\n")
	}
	sizes := dpSizes(rep)
	if len(sizes) >= 2 {
		lo, hi := sizes[0], sizes[len(sizes)-1]
		p("### From %s to %s services\n\n", thousands(lo.Services), thousands(hi.Services))
		p("Loss of each path's figure from the smallest to the largest size, as a fraction of direct\n")
		p("at the same size (the sizes run minutes apart, and direct, which no service touches,\n")
		p("absorbs the machine's change of load); the raw loss in parentheses. Negative: a gain.\n\n")
		p("| path | TCP_CRR | UDP pkt/s at the endpoint | UDP pkt/s forwarded by node1 |\n| --- | ---: | ---: | ---: |\n")
		for _, path := range dpCasePaths(rep) {
			if path == "direct" {
				continue
			}
			if l, ok := dpLossOf(rep, path, lo, hi); ok {
				p("| %s | %s | %s | %s |\n", l.Label, l.TCP, l.UDP, l.Node1)
			}
		}
		p("\n")
	}
	dpTargetsMarkdown(&w, rep)
	dpXDPMarkdown(&w, rep)
	dpDSRMarkdown(&w, rep)
	if len(notes) > 0 {
		p("Not measured, or with failures:\n\n")
		for i, n := range notes {
			p("%d. %s\n", i+1, n)
		}
		p("\n")
	}
	if o.PlotDir != "" {
		for _, f := range []string{plotDPTCP, plotDPUDP, plotDPUDPNode1} {
			if _, err := os.Stat(filepath.Join(o.PlotDir, f)); err == nil {
				p("![%s](%s)\n\n", strings.TrimSuffix(f, ".svg"), reportLink(o, f))
			}
		}
	}
	p("How it is measured:\n\n")
	p("- **Topology**: `internal/testnet` with one pod behind each node: client — node1 — node2 —\n")
	p("  pod, veth pairs, IPv4. node1 holds the path's dataplane; the measured services are a TCP\n")
	p("  and a UDP service with node ports %d and %d and one endpoint, the pod behind node2\n", dpTCPNodePort, dpUDPNodePort)
	p("  (externalTrafficPolicy Cluster: node1 translates the destination and masquerades the\n")
	p("  source). The other services are `internal/scale`'s (every tenth with a node port, their\n")
	p("  endpoints routed nowhere). **direct** sends to the pod's own address through the same node1\n")
	p("  without any rule: the ceiling of this machine. The kube-proxy layouts are `internal/scale`'s,\n")
	p("  loaded with `nft -f` or `iptables-restore`, with the measured services' rules written the\n")
	p("  same way (in the middle of KUBE-SERVICES and KUBE-NODEPORTS, which iptables walks for\n")
	p("  every new connection to a node port); both have kube-proxy 1.36's filter side (its base\n")
	p("  chains or INPUT/FORWARD/OUTPUT jumps, which run on every new flow: in a one-way UDP flood,\n")
	p("  on every datagram) as well as the NAT side.\n")
	if dpHasDSR(rep) {
		p("- **Direct server return** (the DSR paths): node1 sends a flow to the endpoint inside IPIP\n")
		p("  without SNAT; the client also has a link to node2 (its eth1: testnet's `ClientToNode2`),\n")
		p("  and node2 runs an eBPF backend of its own with tc north-south and the measured services\n")
		p("  alone, whose endpoint is local there: it unwraps the flows, the endpoint sees the client,\n")
		p("  and its replies go from node2 to the client directly, not back through node1.\n")
	}
	p("- **Wire-like peers, on every path**: the far ends of node1's veths toward the client, node2\n")
	p("  and the uplink stand for a wire, as the eBPF backend's `NorthSouthXDPVeth` requires: each\n")
	p("  runs an XDP program that passes everything (so the veth takes XDP frames from node1) and\n")
	p("  has transmit checksum offload off (so packets reach node1 with complete checksums, which XDP\n")
	p("  cannot finish). Every path runs on this same rig so that the paths compare; it also means\n")
	p("  that those veths receive in NAPI and that the client's eth0 has no segmentation offload.\n")
	p("  Runs before this rig (the same tool before commit 969b513) are not comparable with these.\n")
	p("- **TCP_CRR** (like netperf's): %d concurrent clients in the client namespace, each on its own\n", op.Clients)
	p("  thread with blocking system calls, open a connection, send %d bytes, read %d bytes and the\n", crrRequestLen, crrRequestLen)
	p("  server's close, and close; a server in the pod with %d threads (SO_REUSEPORT) accepts, reads,\n", op.ServerThreads)
	p("  answers and closes first. Connections per second over the timed window; latency is of\n")
	p("  whole transactions. The clients and the server share the machine's CPUs with the kernel's\n")
	p("  work, so this is the dataplane's cost per connection diluted by the applications' cost.\n")
	p("- **UDP at saturation**: a sender in the client namespace (Go, AF_PACKET with\n")
	pin := "not pinned"
	if op.SenderCPU >= 0 {
		pin = fmt.Sprintf("pinned to CPU %d", op.SenderCPU)
	}
	p("  PACKET_QDISC_BYPASS, sendmmsg of %d pre-built %d-byte frames, %s) sends as fast as\n", udpBatch, udpFrameLen, pin)
	p("  it can to the UDP node port, cycling through %d source ports (flows), so that after the\n", op.Flows)
	p("  warm-up every packet belongs to a known flow: the steady per-packet cost, not connection\n")
	p("  set-up. ")
	if op.NAPI {
		p("node1 receives from the client with threaded NAPI (GRO on its veth; the client's frames\n")
		p("  take that path because the wire-like client's eth0 has no segmentation offload): node1's\n")
		p("  receive path runs in a kernel thread of its own, not in the sender's system calls. When its\n")
		p("  ring is full, the client's veth refuses the frame (sendmmsg fails, the sender tries again at\n")
		p("  once) and counts a transmit drop: **offered** and **node1 drops** then count the sender's\n")
		p("  refused attempts, not packets lost inside node1. The figure is what node1's thread forwards\n")
		p("  while the sender keeps trying, as far as the machine's other load leaves them CPU time. ")
	} else {
		p("node1's whole receive path, and node2's and the pod's, runs in the sender's system\n")
		p("  calls (softirq after each send), so the figure includes the sender's own cost. ")
	}
	p("Nothing listens on the\n")
	p("  pod's port: the datagrams are counted at the pod's interface (packets/s at the endpoint).\n")
	p("  **offered** is what the client's interface handed to node1's, **node1 drops** the share of it\n")
	p("  that node1 did not forward toward node2 (dropped at its entry or inside it).\n")
	p("- **UDP forwarded by node1 (node2 drops at XDP)**: a second UDP run of each path in each round,\n")
	p("  the same sender, while node2's interface toward node1 runs, instead of the pass program, an\n")
	p("  XDP program that counts every IPv4 packet from node1 in a per-CPU array and drops it\n")
	p("  (ARP passes). On veths node1's receive thread also runs node2's routing and the pod's\n")
	p("  delivery (with an ICMP port unreachable, and its route lookups, for every datagram), so the\n")
	p("  figure at the endpoint is the whole chain's cost on one CPU; with the sink that work leaves\n")
	p("  it, and the figure is what node1 forwarded toward node2: the sink's count over the window\n")
	p("  (read with the interface counters), which counts only packets node1 sent, not the sender's\n")
	p("  refused attempts. DSR paths' IPIP packets count alike. node2's veth still receives them\n")
	p("  (the XDP path's frames without an skb, the others' skbs) on the same CPU. A run in which the\n")
	p("  sink counted nothing, or more than %d packets reached the endpoint, counts as failed.\n", sinkLeak)
	p("- The machine is shared with other work (see the load average): compare paths within a size of\n")
	p("  one run, not figures across runs. eBPF paths whose backend option does not exist yet are\n")
	p("  listed as not available (the backend's Config lacks the field, or New refuses the value).\n")
	return w.String()
}

// dpHasDSR says the report has a path with direct server return.
func dpHasDSR(rep *DatapathReport) bool {
	return slices.ContainsFunc(dpCasePaths(rep), func(name string) bool {
		p, ok := dpPathByName(name)
		return ok && p.dsr()
	})
}

// reportLink is the path of a file of the plot directory relative to
// the report.
func reportLink(o Options, f string) string {
	rel := o.PlotDir
	if o.Out != "" && o.PlotDir != "" {
		if r, err := filepath.Rel(filepath.Dir(o.Out), o.PlotDir); err == nil {
			rel = filepath.ToSlash(r)
		}
	}
	if rel == "." || rel == "" {
		return f
	}
	return rel + "/" + f
}

// dpCasePaths returns the paths of the report's cases in run order.
func dpCasePaths(rep *DatapathReport) []string {
	var out []string
	for _, c := range rep.Cases {
		if !slices.Contains(out, c.Path) {
			out = append(out, c.Path)
		}
	}
	return out
}

// writeDatapathPlots draws a bar per path and size: TCP_CRR connections,
// UDP packets at the endpoint and UDP packets node1 forwarded into
// node2's sink, per second.
func writeDatapathPlots(rep *DatapathReport, dir string) error {
	var labels []string
	var paths []string
	for _, path := range dpCasePaths(rep) {
		for _, c := range rep.Cases {
			if c.Path == path && c.ok() {
				labels, paths = append(labels, c.Label), append(paths, path)
				break
			}
		}
	}
	if len(paths) == 0 {
		return nil
	}
	for _, s := range []struct {
		file, title, unit string
		y                 func(dpFig) float64
	}{
		{plotDPTCP, "TCP_CRR through a node port to an endpoint on another node", "connections per second",
			func(f dpFig) float64 { return f.TCP.PerSec }},
		{plotDPUDP, "UDP at saturation through a node port: packets at the endpoint", "packets per second",
			func(f dpFig) float64 { return f.UDP.Endpoint }},
		{plotDPUDPNode1, "UDP at saturation through a node port: packets node1 forwarded (node2 drops at XDP)", "packets per second",
			func(f dpFig) float64 { return f.Sink.Forwarded }},
	} {
		ch := plot.BarChart{Title: s.title, ValueLabel: s.unit, Categories: labels}
		for _, sz := range dpSizes(rep) {
			bs := plot.BarSeries{Name: thousands(sz.Services) + " services"}
			any := false
			for _, path := range paths {
				v := math.NaN()
				if c := dpFind(rep, path, sz); c != nil {
					if y := s.y(dpCaseFigures(c)); y > 0 {
						v, any = y, true
					}
				}
				bs.Values = append(bs.Values, v)
			}
			if any {
				ch.Series = append(ch.Series, bs)
			}
		}
		if len(ch.Series) == 0 {
			continue
		}
		if err := plot.BarsSVG(filepath.Join(dir, s.file), ch); err != nil {
			return err
		}
	}
	return nil
}

// dpMetric is which figure of a case a target reads.
type dpMetric int

const (
	dpTCPCRR      dpMetric = iota // TCP_CRR connections per second
	dpUDPEndpoint                 // UDP packets per second at the endpoint
	dpUDPNode1                    // UDP packets per second node1 forwarded into node2's sink
)

// label names the figure in the targets table.
func (m dpMetric) label() string {
	switch m {
	case dpUDPEndpoint:
		return "UDP pkt/s at the endpoint"
	case dpUDPNode1:
		return "UDP pkt/s forwarded by node1 (node2 drops at XDP)"
	}
	return "TCP_CRR conn/s"
}

// of returns the figure from a case's figures.
func (m dpMetric) of(f dpFig) float64 {
	switch m {
	case dpUDPEndpoint:
		return f.UDP.Endpoint
	case dpUDPNode1:
		return f.Sink.Forwarded
	}
	return f.TCP.PerSec
}

// dpTarget is one target of issue #21: a path's figure at least Min
// times another path's at the same size.
type dpTarget struct {
	Path, Of string // the path and the one it is compared with
	Measure  dpMetric
	Min      float64
}

// dpTargets are read against both UDP measurements: #21 states its UDP
// targets for UDP at saturation, which the endpoint measures through
// node2 and the pod too, and the sink at node1 alone.
var dpTargets = []dpTarget{
	{Path: "ebpf-tc", Of: "nftables", Measure: dpUDPEndpoint, Min: 1.3},
	{Path: "ebpf-tc-dsr", Of: "nftables", Measure: dpUDPEndpoint, Min: 1.3},
	{Path: "ebpf-xdp", Of: "nftables", Measure: dpUDPEndpoint, Min: 2},
	{Path: "ebpf-xdp-dsr", Of: "nftables", Measure: dpUDPEndpoint, Min: 2},
	{Path: "ebpf-tc", Of: "nftables", Measure: dpUDPNode1, Min: 1.3},
	{Path: "ebpf-tc-dsr", Of: "nftables", Measure: dpUDPNode1, Min: 1.3},
	{Path: "ebpf-xdp", Of: "nftables", Measure: dpUDPNode1, Min: 2},
	{Path: "ebpf-xdp-dsr", Of: "nftables", Measure: dpUDPNode1, Min: 2},
	{Path: "ebpf-tc", Of: "direct", Measure: dpTCPCRR, Min: 0.9},
	{Path: "ebpf-tc-dsr", Of: "direct", Measure: dpTCPCRR, Min: 0.9},
	{Path: "ebpf-xdp", Of: "direct", Measure: dpTCPCRR, Min: 0.9},
	{Path: "ebpf-xdp-dsr", Of: "direct", Measure: dpTCPCRR, Min: 0.9},
}

// dpTargetsMarkdown writes the table of the targets of issue #21 for
// the paths the run included.
func dpTargetsMarkdown(w *strings.Builder, rep *DatapathReport) {
	paths, sizes := dpCasePaths(rep), dpSizes(rep)
	var rows []dpTarget
	for _, t := range dpTargets {
		if slices.Contains(paths, t.Path) {
			rows = append(rows, t)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Targets of #21\n\n| target |")
	for _, sz := range sizes {
		fmt.Fprintf(w, " %s services |", thousands(sz.Services))
	}
	fmt.Fprintf(w, "\n| --- |%s\n", strings.Repeat(" ---: |", len(sizes)))
	for _, t := range rows {
		what := t.Measure.label()
		label := t.Path
		if p, ok := dpPathByName(t.Path); ok {
			label = p.Label
		}
		fmt.Fprintf(w, "| %s: %s ≥ %.1f× %s |", label, what, t.Min, t.Of)
		for _, sz := range sizes {
			cell := "not measured"
			for _, c := range rep.Cases {
				if c.Path == t.Path && c.Size == sz && !c.ok() {
					cell = map[string]string{"unavailable": "not available", "unsupported": "not supported here", "cut": "cut", "error": "failed"}[c.Status]
				}
			}
			a, b := dpFind(rep, t.Path, sz), dpFind(rep, t.Of, sz)
			if a != nil && b != nil {
				x, y := t.Measure.of(dpCaseFigures(a)), t.Measure.of(dpCaseFigures(b))
				if x > 0 && y > 0 {
					met := "not met"
					if x/y >= t.Min {
						met = "met"
					}
					cell = fmt.Sprintf("%.2f×, %s", x/y, met)
				}
			}
			fmt.Fprintf(w, " %s |", cell)
		}
		fmt.Fprintf(w, "\n")
	}
	fmt.Fprintf(w, "\n")
	dpScaleTargetMarkdown(w, rep)
}

// dpLoss is a path's loss from one size to another, TCP_CRR, UDP at
// the endpoint and UDP forwarded by node1.
type dpLoss struct {
	Label string
	// TCP, UDP and Node1 are formatted: the loss relative to direct,
	// the raw loss in parentheses.
	TCP, UDP, Node1 string
	// The *Rel are the losses relative to direct (the raw ones without
	// direct), the *Raw the raw ones, as fractions; the *OK say each
	// was measured.
	TCPRel, UDPRel, Node1Rel float64
	TCPRaw, UDPRaw, Node1Raw float64
	TCPOK, UDPOK, Node1OK    bool
}

// dpLossOf returns path's loss from size lo to size hi: 1 - (hi/lo),
// each figure divided by direct's at the same size when direct was
// measured at both (direct, which no service touches, absorbs the
// machine's change of load between the sizes).
func dpLossOf(rep *DatapathReport, path string, lo, hi Size) (dpLoss, bool) {
	a, b := dpFind(rep, path, lo), dpFind(rep, path, hi)
	if a == nil || b == nil {
		return dpLoss{}, false
	}
	fa, fb := dpCaseFigures(a), dpCaseFigures(b)
	var fdl, fdh dpFig
	if dl, dh := dpFind(rep, "direct", lo), dpFind(rep, "direct", hi); dl != nil && dh != nil {
		fdl, fdh = dpCaseFigures(dl), dpCaseFigures(dh)
	}
	loss := func(a, b, da, db float64) (string, float64, float64, bool) {
		if a <= 0 || b <= 0 {
			return "—", 0, 0, false
		}
		raw := 1 - b/a
		if da <= 0 || db <= 0 {
			return fmt.Sprintf("(%+.0f%%)", 100*raw), raw, raw, true
		}
		rel := 1 - (b/db)/(a/da)
		return fmt.Sprintf("%+.0f%% (%+.0f%%)", 100*rel, 100*raw), rel, raw, true
	}
	l := dpLoss{Label: a.Label}
	l.TCP, l.TCPRel, l.TCPRaw, l.TCPOK = loss(fa.TCP.PerSec, fb.TCP.PerSec, fdl.TCP.PerSec, fdh.TCP.PerSec)
	l.UDP, l.UDPRel, l.UDPRaw, l.UDPOK = loss(fa.UDP.Endpoint, fb.UDP.Endpoint, fdl.UDP.Endpoint, fdh.UDP.Endpoint)
	l.Node1, l.Node1Rel, l.Node1Raw, l.Node1OK = loss(fa.Sink.Forwarded, fb.Sink.Forwarded, fdl.Sink.Forwarded, fdh.Sink.Forwarded)
	return l, true
}

// dpMaxLoss is issue #21's bound on what a backend but iptables may
// lose from 10 to 10,000 services.
const dpMaxLoss = 0.10

// dpScaleTargetMarkdown writes, for each proxykit backend's path but
// iptables', whether it lost at most dpMaxLoss from the smallest to the
// largest size (relative to direct).
func dpScaleTargetMarkdown(w *strings.Builder, rep *DatapathReport) {
	sizes := dpSizes(rep)
	if len(sizes) < 2 {
		return
	}
	lo, hi := sizes[0], sizes[len(sizes)-1]
	// Met when the loss is within the bound both relative to direct and
	// raw; not met when it is beyond it both ways; else the machine's
	// change of load between the sizes (which direct's own change
	// shows) decides, and the run does not.
	verdict := func(s string, rel, raw float64, ok bool) string {
		switch {
		case !ok:
			return s
		case rel <= dpMaxLoss && raw <= dpMaxLoss:
			return s + ", met"
		case rel > dpMaxLoss && raw > dpMaxLoss:
			return s + ", **not met**"
		}
		return s + ", undecided (load)"
	}
	var rows []string
	for _, path := range dpCasePaths(rep) {
		dp, ok := dpPathByName(path)
		if !ok || dp.Backend == "" || strings.HasPrefix(dp.Backend, "iptables") {
			continue
		}
		if l, ok := dpLossOf(rep, path, lo, hi); ok {
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |\n", l.Label, verdict(l.TCP, l.TCPRel, l.TCPRaw, l.TCPOK), verdict(l.UDP, l.UDPRel, l.UDPRaw, l.UDPOK), verdict(l.Node1, l.Node1Rel, l.Node1Raw, l.Node1OK)))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "No backend but iptables loses more than %.0f%% from %s to %s services (the loss relative to\n", 100*dpMaxLoss, thousands(lo.Services), thousands(hi.Services))
	fmt.Fprintf(w, "direct, the raw loss in parentheses; the proxykit backends, not the kube-proxy references).\n")
	fmt.Fprintf(w, "Met: within %.0f%% both ways; not met: beyond it both ways; undecided: the two disagree, because\n", 100*dpMaxLoss)
	fmt.Fprintf(w, "the machine's load changed between the sizes and direct's own figure moved with it:\n\n")
	fmt.Fprintf(w, "| path | TCP_CRR | UDP pkt/s at the endpoint | UDP pkt/s forwarded by node1 |\n| --- | ---: | ---: | ---: |\n")
	for _, r := range rows {
		w.WriteString(r)
	}
	fmt.Fprintf(w, "\n")
}

// dpRunRow is one case's runs of one kind (TCP_CRR or UDP) that carry
// a record of type T.
type dpRunRow[T any] struct {
	label, what string
	runs        []*T
}

// dpRunRows returns a row per case and kind of run whose runs carry a
// record (tcp and udp return it, nil for none), in the report's order.
func dpRunRows[T any](rep *DatapathReport, tcp func(*crrResult) *T, udp func(*udpResult) *T) []dpRunRow[T] {
	var rows []dpRunRow[T]
	for _, c := range rep.Cases {
		var t, u []*T
		for _, r := range c.TCP {
			if r != nil && tcp(r) != nil {
				t = append(t, tcp(r))
			}
		}
		for _, r := range c.UDP {
			if r != nil && udp(r) != nil {
				u = append(u, udp(r))
			}
		}
		label := c.Label + ", " + thousands(c.Size.Services) + " services"
		if len(t) > 0 {
			rows = append(rows, dpRunRow[T]{label, "TCP_CRR", t})
		}
		if len(u) > 0 {
			rows = append(rows, dpRunRow[T]{label, "UDP", u})
		}
	}
	return rows
}

// dpXDPMarkdown writes what the XDP program did in the runs of the paths
// that have one (proxykit_ebpf_xdp_packets_total, read before and after
// each run).
func dpXDPMarkdown(w *strings.Builder, rep *DatapathReport) {
	rows := dpRunRows(rep, func(r *crrResult) *xdpCounts { return r.XDP }, func(r *udpResult) *xdpCounts { return r.XDP })
	dpRunTable(w, rows, "What XDP did", "`proxykit_ebpf_xdp_packets_total`"+` of node1's proxier, read before and after each run (so the
warm-up and the client's start are included): packets the XDP program redirected out of
another interface, sent back out of the one they came in on (tx), or passed to tc behind it.
A run in which XDP redirected nothing counts as failed (its figures would be tc's); on a DSR
path, where XDP passes every flow to tc (which wraps it), one in which XDP saw nothing. Medians
over the runs; the share is of every packet XDP saw.`,
		[]string{"redirected", "tx", "passed to tc", "redirected share"}, func(runs []*xdpCounts) []string {
			var share []float64
			for _, x := range runs {
				if t := x.Total(); t > 0 {
					share = append(share, float64(x.Redirect)/float64(t))
				}
			}
			return []string{
				thousands(int(medianOf(runs, func(x *xdpCounts) uint64 { return x.Redirect }))),
				thousands(int(medianOf(runs, func(x *xdpCounts) uint64 { return x.TX }))),
				thousands(int(medianOf(runs, func(x *xdpCounts) uint64 { return x.Pass }))),
				fmt.Sprintf("%.1f%%", 100*median(share)),
			}
		})
}

// dpDSRMarkdown writes where node2's packets went in the runs of the
// paths with direct server return (interface counters read before and
// after each run).
func dpDSRMarkdown(w *strings.Builder, rep *DatapathReport) {
	rows := dpRunRows(rep, func(r *crrResult) *dsrCounts { return r.DSR }, func(r *udpResult) *dsrCounts { return r.DSR })
	dpRunTable(w, rows, "Where node2's packets went (direct server return)", `Packets from node2 during each run of a DSR path (the warm-up and the client's start
included): to the client over node2's own link (received on the client's eth1), and to
node1. A TCP_CRR run counts as failed unless more went to the client than to node1 (its
figures would be SNAT's). In the UDP runs nothing answers the datagrams but the pod's
rate-limited ICMP port unreachable, so their few packets are not checked. Medians over the runs.`,
		[]string{"to the client", "to node1"}, func(runs []*dsrCounts) []string {
			return []string{
				thousands(int(medianOf(runs, func(d *dsrCounts) uint64 { return d.ToClient }))),
				thousands(int(medianOf(runs, func(d *dsrCounts) uint64 { return d.ToNode1 }))),
			}
		})
}

// dpRunTable writes a subsection titled title, with the paragraph
// intro and a table of rows: the path, the kind of run, the cells that
// cells makes of the runs (heads names them), the number of runs.
// Without rows it writes nothing.
func dpRunTable[T any](w *strings.Builder, rows []dpRunRow[T], title, intro string, heads []string, cells func([]*T) []string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### %s\n\n%s\n\n", title, intro)
	fmt.Fprintf(w, "| path | run | %s | runs |\n", strings.Join(heads, " | "))
	fmt.Fprintf(w, "| --- | --- |%s ---: |\n", strings.Repeat(" ---: |", len(heads)))
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %d |\n", r.label, r.what, strings.Join(cells(r.runs), " | "), len(r.runs))
	}
	fmt.Fprintf(w, "\n")
}

// medianOf returns the median of a counter over runs.
func medianOf[T any](runs []*T, counter func(*T) uint64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = float64(counter(r))
	}
	return median(v)
}

// micros formats a duration in microseconds, as milliseconds from 10 ms.
func micros(us float64) string {
	if us >= 10000 {
		return num(us/1000) + " ms"
	}
	return num(us) + " µs"
}
