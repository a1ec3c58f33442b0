package main

import (
	"strings"
	"testing"
)

// TestDatapathTargets renders the targets of issue #21 from made-up
// figures: the ratios with met or not met, the 10 → 10,000 loss
// relative to direct for the proxykit backends but iptables, and what
// XDP did.
func TestDatapathTargets(t *testing.T) {
	lo, hi := Size{Services: 10, Endpoints: 1}, Size{Services: 10000, Endpoints: 1}
	// c is an ok case with tcp connections/s and udp packets/s at the
	// endpoint.
	c := func(path string, sz Size, tcp, udp float64, x *xdpCounts) *DPCase {
		p, _ := dpPathByName(path)
		return &DPCase{Path: path, Label: p.Label, Size: sz, Status: "ok",
			TCP: []*crrResult{{PerSec: tcp, XDP: x}},
			UDP: []*udpResult{{Seconds: 1, Counters: map[string]ifCounters{"endpoint": {RxPackets: uint64(udp)}}, XDP: x}}}
	}
	x := &xdpCounts{Redirect: 90, Pass: 10}
	dsr := c("ebpf-tc-dsr", lo, 900, 60, nil)
	dsr.TCP[0].DSR, dsr.UDP[0].DSR = &dsrCounts{ToClient: 4000, ToNode1: 1}, &dsrCounts{ToClient: 7}
	rep := &DatapathReport{Cases: []*DPCase{
		c("direct", lo, 1000, 100, nil), c("nftables", lo, 500, 50, nil), c("iptables-nft", lo, 500, 50, nil),
		c("ebpf-tc", lo, 950, 70, nil), dsr, c("ebpf-xdp", lo, 800, 120, x),
		c("direct", hi, 500, 100, nil), c("nftables", hi, 200, 50, nil), c("iptables-nft", hi, 100, 10, nil),
		c("ebpf-tc", hi, 475, 70, nil), c("ebpf-xdp", hi, 400, 100, x),
	}}
	var w strings.Builder
	dpTargetsMarkdown(&w, rep)
	dpXDPMarkdown(&w, rep)
	dpDSRMarkdown(&w, rep)
	md := w.String()
	for _, want := range []string{
		"| ebpf (tc north-south, SNAT): UDP pkt/s ≥ 1.3× nftables | 1.40×, met | 1.40×, met |",
		"| ebpf (XDP north-south): UDP pkt/s ≥ 2.0× nftables | 2.40×, met | 2.00×, met |",
		"| ebpf (tc north-south, SNAT): TCP_CRR conn/s ≥ 0.9× direct | 0.95×, met | 0.95×, met |",
		"| ebpf (XDP north-south): TCP_CRR conn/s ≥ 0.9× direct | 0.80×, not met | 0.80×, not met |",
		// nftables: TCP 500 → 200 while direct halved: 20% lost
		// relative to direct (60% raw); UDP unchanged.
		"| nftables | +20% (+60%), **not met** | +0% (+0%), met |",
		"| ebpf (tc north-south, SNAT) | +0% (+50%), undecided (load) | +0% (+0%), met |",
		"| ebpf (XDP north-south) | +0% (+50%), undecided (load) | +17% (+17%), **not met** |",
		"| ebpf (XDP north-south), 10 services | TCP_CRR | 90 | 0 | 10 | 90.0% | 1 |",
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
