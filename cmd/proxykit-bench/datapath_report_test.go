package main

import (
	"strings"
	"testing"
)

// dpTestReport is a made-up report at 10 and 10,000 services: each
// case one TCP_CRR run of tcp connections/s, one UDP run of udp packets/s
// at the endpoint, and (sink > 0) one run into node2's sink that
// counted sink packets/s; the DSR case has no sink run.
func dpTestReport() *DatapathReport {
	lo, hi := Size{Services: 10, Endpoints: 1}, Size{Services: 10000, Endpoints: 1}
	c := func(path string, sz Size, tcp, udp, sink float64, x *xdpCounts) *DPCase {
		p, _ := dpPathByName(path)
		cs := &DPCase{Path: path, Label: p.Label, Size: sz, Status: "ok",
			TCP: []*crrResult{{PerSec: tcp, XDP: x}},
			UDP: []*udpResult{{Seconds: 1, Counters: map[string]ifCounters{"endpoint": {RxPackets: uint64(udp)}}, XDP: x}}}
		if sink > 0 {
			n := uint64(2 * sink) // over a 2-s window
			cs.UDPSink = []*udpResult{{Seconds: 2, Sink: &n, XDP: x, Counters: map[string]ifCounters{
				"client": {TxPackets: 3 * n}, "node1-out": {TxPackets: n}}}}
		}
		return cs
	}
	x := &xdpCounts{Redirect: 90, Pass: 10}
	dsr := c("ebpf-tc-dsr", lo, 900, 60, 0, nil)
	dsr.TCP[0].DSR, dsr.UDP[0].DSR = &dsrCounts{ToClient: 4000, ToNode1: 1}, &dsrCounts{ToClient: 7}
	return &DatapathReport{Options: dpOptions{Repeat: 1}, Cases: []*DPCase{
		c("direct", lo, 1000, 100, 400, nil), c("nftables", lo, 500, 50, 200, nil), c("iptables-nft", lo, 500, 50, 150, nil),
		c("ebpf-tc", lo, 950, 70, 300, nil), dsr, c("ebpf-xdp", lo, 800, 120, 380, x),
		c("direct", hi, 500, 100, 400, nil), c("nftables", hi, 200, 50, 200, nil), c("iptables-nft", hi, 100, 10, 100, nil),
		c("ebpf-tc", hi, 475, 70, 250, nil), c("ebpf-xdp", hi, 400, 100, 500, x),
	}}
}

// TestDatapathTargets renders the targets of issue #21 from made-up
// figures: the ratios with met or not met, each row naming its
// measurement (UDP at the endpoint, UDP forwarded by node1 into node2's
// sink, TCP_CRR), the 10 → 10,000 loss relative to direct for the
// proxykit backends but iptables, and what XDP did.
func TestDatapathTargets(t *testing.T) {
	rep := dpTestReport()
	var w strings.Builder
	dpTargetsMarkdown(&w, rep)
	dpXDPMarkdown(&w, rep)
	dpDSRMarkdown(&w, rep)
	md := w.String()
	for _, want := range []string{
		"| ebpf (tc north-south, SNAT): UDP pkt/s at the endpoint ≥ 1.3× nftables | 1.40×, met | 1.40×, met |",
		"| ebpf (XDP north-south): UDP pkt/s at the endpoint ≥ 2.0× nftables | 2.40×, met | 2.00×, met |",
		"| ebpf (tc north-south, SNAT): UDP pkt/s forwarded by node1 (node2 drops at XDP) ≥ 1.3× nftables | 1.50×, met | 1.25×, not met |",
		"| ebpf (XDP north-south): UDP pkt/s forwarded by node1 (node2 drops at XDP) ≥ 2.0× nftables | 1.90×, not met | 2.50×, met |",
		"| ebpf (tc north-south, DSR): UDP pkt/s forwarded by node1 (node2 drops at XDP) ≥ 1.3× nftables | not measured | not measured |",
		"| ebpf (tc north-south, SNAT): TCP_CRR conn/s ≥ 0.9× direct | 0.95×, met | 0.95×, met |",
		"| ebpf (XDP north-south): TCP_CRR conn/s ≥ 0.9× direct | 0.80×, not met | 0.80×, not met |",
		// nftables: TCP 500 → 200 while direct halved: 20% lost
		// relative to direct (60% raw); UDP unchanged.
		"| nftables | +20% (+60%), **not met** | +0% (+0%), met | +0% (+0%), met |",
		"| ebpf (tc north-south, SNAT) | +0% (+50%), undecided (load) | +0% (+0%), met | +17% (+17%), **not met** |",
		"| ebpf (XDP north-south) | +0% (+50%), undecided (load) | +17% (+17%), **not met** | -32% (-32%), met |",
		"| ebpf (XDP north-south), 10 services | TCP_CRR | 90 | 0 | 10 | 90.0% | 1 |",
		"| ebpf (XDP north-south), 10 services | UDP | 90 | 0 | 10 | 90.0% | 1 |",
		"| ebpf (tc north-south, DSR): TCP_CRR conn/s ≥ 0.9× direct | 0.90×, met | not measured |",
		"| ebpf (tc north-south, DSR), 10 services | TCP_CRR | 4,000 | 1 | 1 |",
		"| ebpf (tc north-south, DSR), 10 services | UDP | 7 | 0 | 1 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no line %q in\n%s", want, md)
		}
	}
	if strings.Contains(md, "ebpf (tc north-south, SNAT), 10 services |") {
		t.Errorf("a path without direct server return in the DSR table:\n%s", md)
	}
	if strings.Contains(md, "| iptables (nft) |") {
		t.Errorf("iptables has no 10 → 10,000 target:\n%s", md)
	}
}

// TestDatapathSinkColumns renders the per-size tables: the UDP figure at
// the endpoint and the one forwarded by node1 into node2's sink, each
// with its ratios to direct and nftables, in columns of their own; the
// sink's plot is linked; a case without sink runs shows a dash.
func TestDatapathSinkColumns(t *testing.T) {
	md := datapathMarkdown(dpTestReport(), Options{})
	for _, want := range []string{
		"| UDP pkt/s at the endpoint | × direct | × nftables | node1 drops | offered pkt/s | UDP pkt/s forwarded by node1 (node2 drops at XDP) | × direct | × nftables | set-up |",
		// XDP at 10 services: 120 at the endpoint (1.20× direct, 2.40×
		// nftables); the sink counted 760 in 2 s: 380/s (0.95×, 1.90×).
		"| 120 | 1.20 | 2.40 | 0.0% | — | 380 | 0.95 | 1.90 | 0 ms |",
		"| 300 | 0.75 | 1.50 | 0 ms |",
		// The DSR case has no sink run.
		"| 60 | 0.60 | 1.20 | 0.0% | — | — | — | — | 0 ms |",
		"| path | TCP_CRR | UDP pkt/s at the endpoint | UDP pkt/s forwarded by node1 |",
		"**UDP forwarded by node1 (node2 drops at XDP)**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	f := dpCaseFigures(dpTestReport().Cases[5])
	if f.Sink.N != 1 || f.Sink.Forwarded != 380 || f.Sink.Offered != 3*380 {
		t.Errorf("sink figures %+v", f.Sink)
	}
}
