package kubeproxy_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/kubeproxy"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Sides of a comparison: the kube-proxy oracle in one of its modes, or a
// proxykit backend.
const (
	sideKPNFT       = "kube-proxy-nftables"
	sideKPIPT       = "kube-proxy-iptables"
	sidePKNFT       = "proxykit-nftables"
	sidePKIPTNFT    = "proxykit-iptables-nft"
	sidePKIPTLegacy = "proxykit-iptables-legacy"
)

// Backends compared, each against its kube-proxy reference. kube-proxy's
// iptables mode runs with iptables-nft and is the reference for both
// iptables flavours of proxykit.
const (
	bNFT       = "nftables"
	bIPTNFT    = "iptables-nft"
	bIPTLegacy = "iptables-legacy"
)

var allBackends = []string{bNFT, bIPTNFT, bIPTLegacy}

// pairs maps each backend to its kube-proxy side and its proxykit side.
var pairs = map[string][2]string{
	bNFT:       {sideKPNFT, sidePKNFT},
	bIPTNFT:    {sideKPIPT, sidePKIPTNFT},
	bIPTLegacy: {sideKPIPT, sidePKIPTLegacy},
}

var allSides = []string{sideKPNFT, sideKPIPT, sidePKNFT, sidePKIPTNFT, sidePKIPTLegacy}

// Timeouts.
const (
	applyTimeout = 60 * time.Second
	stopTimeout  = 10 * time.Second
)

// sandbox is one topology whose node1 one side programs.
type sandbox struct {
	side string
	tn   *testnet.Topology
	// apply programs the objects of a phase (every scenario's Service and
	// EndpointSlice) and returns when they are in the kernel.
	apply func(ctx context.Context, phase int, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) error
}

// icmpSysctls are set on node1 and on the uplink of every sandbox, both
// sides alike: no ICMP rate limiting, so that a reject always shows as a
// reject however many probes run at once (the per-peer limit allows a
// burst of 6 per second). The uplink matters for IPv6: it does not
// forward, and answers a packet node1 sends it for an address it does not
// hold (a service address node1 did not handle) with an ICMPv6
// unreachable, which rate limiting would turn into a drop now and then.
var icmpSysctls = [][2]string{
	{"net/ipv4/icmp_ratemask", "0"},
	{"net/ipv4/icmp_ratelimit", "0"},
	{"net/ipv6/icmp/ratelimit", "0"},
	{"net/ipv6/icmp/ratemask", ""},
}

// nodePortCIDRs is the explicit nodePortAddresses both sides get (outside
// the defaults group): node1's addresses on its links, as single-address
// prefixes.
func nodePortCIDRs(tn *testnet.Topology) []netip.Prefix {
	var out []netip.Prefix
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		for _, a := range tn.Node1.Addrs(f) {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

func podNetworks() []netip.Prefix {
	return []netip.Prefix{testnet.PodNetworkIPv4, testnet.PodNetworkIPv6}
}

// newOracleSandbox starts the kube-proxy oracle in mode on node1 of tn.
// Must run on the test's goroutine.
func newOracleSandbox(t *testing.T, side string, tn *testnet.Topology, mode kubeproxy.Mode, defaults bool, dir string) *sandbox {
	opts := kubeproxy.Options{
		Mode:             mode,
		NodeIPs:          []netip.Addr{tn.Node1.IPv4, tn.Node1.IPv6},
		HostnameOverride: testnet.Node1Name,
		ClusterCIDRs:     podNetworks(),
	}
	if !defaults {
		for _, p := range nodePortCIDRs(tn) {
			opts.NodePortAddresses = append(opts.NodePortAddresses, p.String())
		}
	}
	o := kubeproxy.New(t, tn.Node1.Path(), opts)
	return &sandbox{
		side: side,
		tn:   tn,
		apply: func(ctx context.Context, phase int, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) error {
			var buf bytes.Buffer
			for _, s := range svcs {
				writeDoc(&buf, s)
			}
			for _, s := range slices {
				writeDoc(&buf, s)
			}
			path := filepath.Join(dir, fmt.Sprintf("%s-phase%d.yaml", side, phase+1))
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				return err
			}
			return o.Apply(ctx, path)
		},
	}
}

func writeDoc(buf *bytes.Buffer, obj any) {
	b, err := yaml.Marshal(obj)
	if err != nil {
		panic(err)
	}
	buf.WriteString("---\n")
	buf.Write(b)
}

// newProxykitSandbox builds a proxykit proxier for side on node1 of tn.
// Nothing runs until the first apply, which delivers the objects as
// additions followed by the Synced calls and starts Run; later applies
// deliver updates. Must run on the test's goroutine.
func newProxykitSandbox(t *testing.T, side string, tn *testnet.Topology, defaults bool) *sandbox {
	cfg := proxier.Config{
		NetNS:           tn.Node1.Path(),
		NodeName:        testnet.Node1Name,
		Families:        []model.IPFamily{model.IPv4, model.IPv6},
		ClusterCIDRs:    podNetworks(),
		NodeIPs:         []netip.Addr{tn.Node1.IPv4, tn.Node1.IPv6},
		MinSyncInterval: 50 * time.Millisecond,
		SyncPeriod:      10 * time.Minute,
		RetryInterval:   100 * time.Millisecond,
	}
	lw := &testLog{t: t, prefix: side + ": "}
	t.Cleanup(func() { lw.mu.Lock(); lw.done = true; lw.mu.Unlock() })
	cfg.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if !defaults {
		cfg.NodePortAddresses = nodePortCIDRs(tn)
	}
	var p proxier.Proxier
	var err error
	switch side {
	case sidePKNFT:
		p, err = nftables.New(nftables.Config{Config: cfg})
	case sidePKIPTNFT:
		p, err = iptables.New(iptables.Config{Config: cfg, Mode: iptables.ModeNFT})
	case sidePKIPTLegacy:
		p, err = iptables.New(iptables.Config{Config: cfg, Mode: iptables.ModeLegacy})
	default:
		t.Fatalf("unknown side %s", side)
	}
	if err != nil {
		t.Fatalf("%s: %v", side, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var started atomic.Bool
	t.Cleanup(func() {
		if started.Load() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", side, err)
				}
			case <-time.After(stopTimeout):
				t.Errorf("%s: Run did not return within %v", side, stopTimeout)
			}
		}
		cancel()
		if err := p.Close(); err != nil {
			t.Errorf("%s: Close: %v", side, err)
		}
	})
	var mu sync.Mutex
	oldSvcs := map[string]*v1.Service{}
	oldSlices := map[string]*discoveryv1.EndpointSlice{}
	rv := 0
	nextRV := func() string { rv++; return fmt.Sprint(rv) }
	return &sandbox{
		side: side,
		tn:   tn,
		apply: func(fctx context.Context, phase int, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice) error {
			mu.Lock()
			defer mu.Unlock()
			first := !started.Load()
			if first {
				p.OnNodeAdd(nodeObject(tn))
				p.OnNodeSynced()
			}
			for _, s := range svcs {
				s = s.DeepCopy()
				s.ResourceVersion = nextRV()
				if old, ok := oldSvcs[s.Name]; ok {
					p.OnServiceUpdate(old, s)
				} else {
					p.OnServiceAdd(s)
				}
				oldSvcs[s.Name] = s
			}
			if first {
				p.OnServiceSynced()
			}
			for _, s := range slices {
				s = s.DeepCopy()
				s.ResourceVersion = nextRV()
				if old, ok := oldSlices[s.Name]; ok {
					p.OnEndpointSliceUpdate(old, s)
				} else {
					p.OnEndpointSliceAdd(s)
				}
				oldSlices[s.Name] = s
			}
			if first {
				p.OnEndpointSlicesSynced()
				started.Store(true)
				go func() { done <- p.Run(ctx) }()
			}
			errc := make(chan error, 1)
			go func() { errc <- p.Flush(fctx) }()
			select {
			case err := <-errc:
				return err
			case err := <-done:
				started.Store(false)
				return fmt.Errorf("Run returned before Flush: %v", err)
			}
		},
	}
}

// nodeObject is node1 as the API server would show it.
func nodeObject(tn *testnet.Topology) *v1.Node {
	n1 := tn.Node1
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   testnet.Node1Name,
			UID:    "uid-node1",
			Labels: map[string]string{v1.LabelHostname: testnet.Node1Name, v1.LabelOSStable: "linux"},
		},
		Spec: v1.NodeSpec{PodCIDR: n1.PodCIDRv4.String(), PodCIDRs: []string{n1.PodCIDRv4.String(), n1.PodCIDRv6.String()}},
	}
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		n.Status.Addresses = append(n.Status.Addresses,
			v1.NodeAddress{Type: v1.NodeInternalIP, Address: n1.IP(f).String()},
			v1.NodeAddress{Type: v1.NodeExternalIP, Address: n1.ExternalIP(f).String()})
	}
	return n
}

// testLog writes log records to the test log until the test ends.
type testLog struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	done   bool
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// dataplaneOf returns what node1 of sb holds for the probe p of sc: the
// rules that name the service or the probe's address (for iptables with
// the chains they lead to) and the connection tracking entries to that
// address.
func dataplaneOf(sb *sandbox, sc *scenario, p probe) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns := sb.tn.Node1.NS
	v6 := sc.fam == model.IPv6
	var dump []string
	switch sb.side {
	case sideKPNFT, sidePKNFT:
		dump = []string{"nft", "list", "ruleset"}
	case sideKPIPT, sidePKIPTNFT:
		dump = []string{"iptables-nft-save"}
		if v6 {
			dump[0] = "ip6tables-nft-save"
		}
	case sidePKIPTLegacy:
		dump = []string{"iptables-legacy-save"}
		if v6 {
			dump[0] = "ip6tables-legacy-save"
		}
	}
	var b strings.Builder
	out, err := ns.Exec(ctx, dump[0], dump[1:]...)
	if err != nil {
		fmt.Fprintf(&b, "%s: %v\n", dump[0], err)
	}
	svc := objNamespace + "/" + sc.name
	addr, port := p.addr.Addr().String(), fmt.Sprint(p.addr.Port())
	lines := strings.Split(out, "\n")
	keep := make([]bool, len(lines))
	chains := map[string]bool{}
	inChain := false
	for i, l := range lines {
		keep[i] = strings.Contains(l, svc) || strings.Contains(l, addr) && strings.Contains(l, port)
		// nft: a chain named for the service, whole.
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "chain ") && strings.Contains(t, svc) {
			inChain = true
		}
		keep[i] = keep[i] || inChain
		if inChain && t == "}" {
			inChain = false
		}
	}
	// For iptables, follow the chains the kept rules lead to, a few hops.
	if !strings.HasPrefix(dump[0], "nft") {
		for range 4 {
			for i, l := range lines {
				f := strings.Fields(l)
				if len(f) > 1 && f[0] == "-A" && chains[f[1]] {
					keep[i] = true
				}
				if !keep[i] {
					continue
				}
				for j := 0; j+1 < len(f); j++ {
					if f[j] == "-j" || f[j] == "-g" {
						chains[f[j+1]] = true
					}
				}
			}
		}
	}
	n := 0
	for i, l := range lines {
		if keep[i] && n < 300 {
			b.WriteString(l)
			b.WriteByte('\n')
			n++
		}
	}
	fam := "ipv4"
	if v6 {
		fam = "ipv6"
	}
	ct, err := ns.Exec(ctx, "conntrack", "-L", "-f", fam)
	if err != nil {
		fmt.Fprintf(&b, "conntrack: %v\n", err)
	}
	for _, l := range strings.Split(ct, "\n") {
		if strings.Contains(l, "dst="+addr+" ") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
