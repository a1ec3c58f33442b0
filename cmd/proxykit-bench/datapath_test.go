package main

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/backends/ebpf"
	"github.com/proxykit/proxykit/internal/testnet"
)

// TestDatapathSmoke runs the data-path mode at 10 services for direct,
// nftables, tc with direct server return, XDP and XDP with direct
// server return, with tiny runs, and checks that every figure was
// measured, that XDP redirected packets in every run (passed them to
// tc with DSR), that the TCP_CRR replies of the DSR paths went from
// node2 to the client (where this kernel runs them), and the report
// section written between the scale run's part and the hand-written
// sections of an existing report. It asserts no rate.
func TestDatapathSmoke(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "nft")
	testnet.RequireCommand(t, "ip")
	o := defaultOptions()
	o.Datapath = true
	datapathSmoke(&o)
	o.Paths = append(o.Paths, "ebpf-tc-dsr", "ebpf-xdp", "ebpf-xdp-dsr")
	dir := t.TempDir()
	o.Out, o.PlotDir = filepath.Join(dir, "BENCHMARKS.md"), dir
	old := "# Benchmarks\n\nscale figures\n\n" + datapathMarker + "\n\nold data path\n\n" + handWritten + "\n\nby hand\n"
	if err := os.WriteFile(o.Out, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	o.Command = buildCommand + " && " + runCommand + " --datapath --smoke"
	o.Log = logWriter{t}
	rep, err := runDatapath(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 5 {
		t.Fatalf("%d cases, want 5", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		p, _ := dpPathByName(c.Path)
		if p.Backend == "ebpf" && c.Status == "unsupported" {
			t.Logf("%s: %s", c.Label, c.Reason)
			continue
		}
		if p.xdp() {
			for _, r := range c.TCP {
				if r.XDP == nil || r.XDP.check(p.dsr()) != nil {
					t.Errorf("%s: TCP_CRR: XDP did not do the work: %+v", c.Label, r.XDP)
				}
			}
			for _, r := range c.UDP {
				if r.XDP == nil || r.XDP.check(p.dsr()) != nil {
					t.Errorf("%s: UDP: XDP did not do the work: %+v", c.Label, r.XDP)
				}
			}
		}
		if p.dsr() {
			for _, r := range c.TCP {
				if r.DSR == nil || r.DSR.checkTCP() != nil {
					t.Errorf("%s: TCP_CRR: replies not by direct server return: %+v", c.Label, r.DSR)
				}
			}
			for _, r := range c.UDP {
				if r.DSR == nil {
					t.Errorf("%s: UDP: no DSR counters", c.Label)
				}
			}
		}
		if !c.ok() || len(c.Errors) > 0 {
			t.Errorf("%s: %s: %s %v", c.Label, c.Status, c.Reason, c.Errors)
			continue
		}
		f := dpCaseFigures(c)
		if f.TCP.N != 1 || f.TCP.PerSec <= 0 || f.TCP.P50 <= 0 {
			t.Errorf("%s: TCP_CRR %+v", c.Label, f.TCP)
		}
		if f.UDP.N != 1 || f.UDP.Endpoint <= 0 || f.UDP.Offered <= 0 {
			t.Errorf("%s: UDP %+v", c.Label, f.UDP)
		}
		if f.Sink.N != 1 || f.Sink.Forwarded <= 0 {
			t.Errorf("%s: UDP into node2's sink %+v", c.Label, f.Sink)
		}
		checkSinkRuns(t, c)
	}
	md, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	for _, want := range []string{"scale figures", "## Data-path throughput", "| nftables |", "direct to the endpoint", o.Command, "by hand", datapathJSON} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "old data path") {
		t.Errorf("the old data-path section was kept:\n%s", s)
	}
	if i, j := strings.Index(s, "## Data-path"), strings.Index(s, handWritten); i < 0 || j < i || strings.Index(s, "scale figures") > i {
		t.Errorf("sections out of order:\n%s", s)
	}
	for _, f := range []string{datapathJSON, plotDPTCP, plotDPUDP, plotDPUDPNode1} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestDatapathSink runs the direct path (no service, the cheapest to
// set up) for one round and checks the run into node2's XDP sink: the
// sink counted packets, no datagram reached the endpoint (which the run
// to the endpoint just before shows it would have without the sink),
// and the sink's count is what node1's interface toward node2 sent.
// Without the sink (node2 passing the packets), the endpoint would see
// them all; without its counter, the figure would be zero.
func TestDatapathSink(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireCommand(t, "ip")
	o := defaultOptions()
	o.Datapath = true
	datapathSmoke(&o)
	o.Paths = []string{"direct"}
	o.Out, o.PlotDir = "", ""
	o.Log = logWriter{t}
	rep, err := runDatapath(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Cases[0]
	if !c.ok() || len(c.Errors) > 0 {
		t.Fatalf("%s: %s %v", c.Status, c.Reason, c.Errors)
	}
	if len(c.UDP) != 1 || c.UDP[0].Counters["endpoint"].RxPackets == 0 {
		t.Errorf("the run to the endpoint saw nothing there: %+v", c.UDP)
	}
	if len(c.UDPSink) != 1 {
		t.Fatalf("%d runs into the sink, want 1", len(c.UDPSink))
	}
	checkSinkRuns(t, c)
}

// checkSinkRuns checks a case's runs into node2's sink: the sink
// counted packets, the endpoint (almost) none, and the sink's count is
// within 5% of what node1's interface toward node2 sent in the window.
func checkSinkRuns(t *testing.T, c *DPCase) {
	t.Helper()
	for _, r := range c.UDPSink {
		ep, out := r.Counters["endpoint"].RxPackets, r.Counters["node1-out"].TxPackets
		if r.Sink == nil || *r.Sink == 0 {
			t.Errorf("%s: the sink counted nothing (node1 sent %d to node2, %d reached the endpoint)", c.Label, out, ep)
			continue
		}
		if ep > sinkLeak {
			t.Errorf("%s: %d packets passed the sink to the endpoint", c.Label, ep)
		}
		if d := float64(*r.Sink) - float64(out); d > 0.05*float64(out)+udpBatch || -d > 0.05*float64(out)+udpBatch {
			t.Errorf("%s: the sink counted %d, node1's interface toward node2 sent %d", c.Label, *r.Sink, out)
		}
	}
}

func TestComposeReport(t *testing.T) {
	old := "# scale\n\n" + datapathMarker + "\n## dp\n\n" + handWritten + "\nhand\n"
	got := composeReport("# scale 2\n", "", old)
	if want := "# scale 2\n\n" + datapathMarker + "\n## dp\n\n" + handWritten + "\nhand\n"; got != want {
		t.Errorf("scale run: got %q, want %q", got, want)
	}
	got = composeReport("", datapathMarker+"\n## dp 2\n", old)
	if want := "# scale\n\n" + datapathMarker + "\n## dp 2\n\n" + handWritten + "\nhand\n"; got != want {
		t.Errorf("data path: got %q, want %q", got, want)
	}
	got = composeReport("", datapathMarker+"\n## dp\n", "")
	if want := "# Benchmarks\n\n" + datapathMarker + "\n## dp\n"; got != want {
		t.Errorf("no old report: got %q, want %q", got, want)
	}
	// A report of before the data-path mode: the scale part is kept.
	got = composeReport("", datapathMarker+"\n## dp\n", "# scale\n\n"+handWritten+"\nhand\n")
	if want := "# scale\n\n" + datapathMarker + "\n## dp\n\n" + handWritten + "\nhand\n"; got != want {
		t.Errorf("old report without a data-path section: got %q, want %q", got, want)
	}
}

func TestSetConfigFields(t *testing.T) {
	type kind string
	var c struct {
		Mode  kind
		On    bool
		N     int
		inner string
	}
	if err := setConfigFields(&c, map[string]string{"Mode": "tc", "On": "true", "N": "7"}); err != nil || c.Mode != "tc" || !c.On || c.N != 7 {
		t.Errorf("got %+v, %v", c, err)
	}
	for _, f := range []map[string]string{{"Missing": "x"}, {"inner": "x"}} {
		err := setConfigFields(&c, f)
		if _, ok := err.(*unavailableError); !ok {
			t.Errorf("%v: error %v, want an unavailableError", f, err)
		}
	}
}

func TestUDPFrames(t *testing.T) {
	src, _ := net.ParseMAC("02:00:00:00:00:01")
	dst, _ := net.ParseMAC("02:00:00:00:00:02")
	fs := udpFrames(src, dst, netip.MustParseAddr("198.51.100.2"), netip.MustParseAddrPort("198.51.100.1:32081"), 3)
	if len(fs) != 3 {
		t.Fatalf("%d frames", len(fs))
	}
	f := fs[2]
	if len(f) != udpFrameLen || f[23] != 17 || f[36] != 0x7d || f[37] != 0x51 || f[34] != 0x27 || f[35] != 0x12 {
		t.Errorf("frame % x", f)
	}
	if ipChecksum(f[14:34]) != 0 { // a header with its checksum sums to zero
		t.Errorf("IPv4 header checksum wrong: % x", f[14:34])
	}
}

func TestKubeProxyLayouts(t *testing.T) {
	filler := dpFiller(Size{30000, 1})
	for _, s := range filler {
		if s.NodePort == dpTCPNodePort || s.NodePort == dpUDPNodePort {
			t.Fatalf("filler service %s has a measured node port", s.Name)
		}
	}
	ep := netip.MustParseAddr("10.244.2.2")
	ipt := dpKubeProxyIPTables(dpFiller(Size{100, 1}), ep)
	lines := strings.Split(ipt, "\n")
	idx := func(sub string) int {
		for i, l := range lines {
			if strings.Contains(l, sub) {
				return i
			}
		}
		return -1
	}
	decl, np, last := idx(":KUBE-SVC-BENCHDPUDP"), idx("-A KUBE-NODEPORTS -m comment --comment bench/dp-udp:http -m udp -p udp --dport 32081"), idx("--dst-type LOCAL -j KUBE-NODEPORTS")
	if decl <= idx("*nat") || np < 0 || last < 0 || np > idx("-A PREROUTING") {
		t.Errorf("iptables layout: declaration at %d, node port rule at %d:\n%.3000s", decl, np, ipt)
	}
	if first := idx("-A KUBE-NODEPORTS"); first >= np {
		t.Errorf("the measured node port is first in KUBE-NODEPORTS, want the middle")
	}
	if idx("*filter") != 0 || idx("-j KUBE-FORWARD") < 0 || idx("*nat") < idx("-j KUBE-FORWARD") {
		t.Errorf("iptables layout: no filter table (KUBE-FORWARD) before the nat table")
	}
	nft := dpKubeProxyNFT(dpFiller(Size{10, 1}), ep)
	for _, want := range []string{"meta l4proto udp dnat to 10.244.2.2:5202", "service-nodeports { udp . 32081 : goto external-BENCHDPUDP-", "cluster-ips { 10.100.0.21 }", "filter-forward ct state new jump cluster-ips-check"} {
		if !strings.Contains(nft, want) {
			t.Errorf("nftables layout lacks %q", want)
		}
	}
}

// TestDatapathPathOptions: every path's ebpf.Config fields exist and
// parse (a misspelt field would make the path "not available"), node2's
// of a DSR path too, and the DSR paths are those that forward so.
func TestDatapathPathOptions(t *testing.T) {
	var dsr []string
	for _, p := range dpPaths {
		if p.dsr() {
			dsr = append(dsr, p.Name)
		}
		if p.EBPF == nil {
			continue
		}
		var c ebpf.Config
		if err := setConfigFields(&c, p.EBPF); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
		if !p.dsr() {
			continue
		}
		n2 := p.node2EBPF()
		c = ebpf.Config{}
		if err := setConfigFields(&c, n2); err != nil {
			t.Errorf("%s, node2: %v", p.Name, err)
		}
		if c.NorthSouth != ebpf.NorthSouthTC || c.NorthSouthXDPVeth || c.NorthSouthForwarding != ebpf.ForwardingDSR {
			t.Errorf("%s: node2's config %+v, want tc north-south with DSR", p.Name, n2)
		}
		if p.EBPF["NorthSouth"] == "xdp" && p.EBPF["NorthSouthXDPVeth"] != "true" {
			t.Errorf("%s: node2EBPF changed node1's fields: %v", p.Name, p.EBPF)
		}
	}
	if want := []string{"ebpf-tc-dsr", "ebpf-xdp-dsr"}; !slices.Equal(dsr, want) {
		t.Errorf("DSR paths %v, want %v", dsr, want)
	}
}

// TestDatapathRunChecks: a run fails when XDP did not do its path's
// work, a DSR path's TCP replies came back through node1, or node2's
// sink counted nothing or let datagrams through.
func TestDatapathRunChecks(t *testing.T) {
	for _, c := range []struct {
		x       xdpCounts
		dsr, ok bool
	}{
		{xdpCounts{Redirect: 5}, false, true},
		{xdpCounts{Pass: 5}, false, false},
		{xdpCounts{}, false, false},
		{xdpCounts{Pass: 5}, true, true},
		{xdpCounts{}, true, false},
	} {
		if err := c.x.check(c.dsr); (err == nil) != c.ok {
			t.Errorf("%+v, DSR %v: %v, want ok %v", c.x, c.dsr, err, c.ok)
		}
	}
	n := func(v uint64) *uint64 { return &v }
	for _, c := range []struct {
		u  udpResult
		ok bool
	}{
		{udpResult{Sink: n(5000), Counters: map[string]ifCounters{"endpoint": {RxPackets: 2}}}, true},
		{udpResult{Sink: n(0)}, false},
		{udpResult{}, false},
		{udpResult{Sink: n(5000), Counters: map[string]ifCounters{"endpoint": {RxPackets: 4000}}}, false},
	} {
		if err := c.u.checkSink(); (err == nil) != c.ok {
			t.Errorf("sink %+v: %v, want ok %v", c.u, err, c.ok)
		}
	}
	for _, c := range []struct {
		d  dsrCounts
		ok bool
	}{
		{dsrCounts{ToClient: 500, ToNode1: 1}, true},
		{dsrCounts{ToClient: 0, ToNode1: 0}, false},
		{dsrCounts{ToClient: 3, ToNode1: 500}, false},
	} {
		if err := c.d.checkTCP(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.d, err, c.ok)
		}
	}
}
