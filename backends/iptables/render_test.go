package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Rootless tests of naming, rendering and restore inputs: no kernel.

// lines renders a service port as "table chain rule" lines, the shared
// rules first, for comparison.
func lines(rd rendering) []string {
	var out []string
	for t := range numTables {
		if rd[t] == nil {
			continue
		}
		for _, s := range rd[t].shared {
			out = append(out, t.String()+" "+s.chain+" "+s.rule)
		}
		for _, c := range rd[t].chains {
			out = append(out, t.String()+" :"+c.name)
			for _, r := range c.rules {
				out = append(out, t.String()+" "+c.name+" "+r)
			}
		}
	}
	return out
}

func mustRender(t *testing.T, r *renderer, s testSvc) rendering {
	t.Helper()
	rd, err := r.service(s.Port.Name, s.Port, s.Targets)
	if err != nil {
		t.Fatal(err)
	}
	return rd
}

// chainsOfKind returns the chains of rd whose names carry kind.
func chainsOfKind(rd rendering, kind string) []chainRules {
	var out []chainRules
	for t := range numTables {
		if rd[t] == nil {
			continue
		}
		for _, c := range rd[t].chains {
			if strings.Contains(c.name, "-"+kind+"-") {
				out = append(out, c)
			}
		}
	}
	return out
}

func TestNames(t *testing.T) {
	n, err := newNames(DefaultChainPrefix)
	if err != nil {
		t.Fatal(err)
	}
	name := backendtest.PortName("web", "http", model.TCP)
	h := n.serviceHash(name)
	if len(h) != 15 || h != n.serviceHash(name) || h == n.serviceHash(backendtest.PortName("web", "http", model.UDP)) {
		t.Fatalf("service hash %q", h)
	}
	for _, c := range []string{n.chain(kindSVC, h), n.chain(kindFW, h), n.sep(name, "[fd00::1]:8080"), n.fixed(chExternal)} {
		if len(c) > maxChainName || !n.owns(c) {
			t.Errorf("chain %q: %d characters", c, len(c))
		}
	}
	if n.sep(name, "10.0.0.1:80") == n.sep(name, "10.0.0.2:80") {
		t.Error("two endpoints share a chain")
	}
	// kube-proxy's hash: base32 of SHA-256, upper case letters and digits.
	if strings.Trim(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" {
		t.Errorf("hash %q is not base32", h)
	}
	for _, bad := range []string{"", "TOO-LONG-PREFIX", "SP ACE", "Q\"UOTE"} {
		if _, err := newNames(bad); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
	if n, err := newNames("K8S_PROXY1"); err != nil || n.hashLen < minHash {
		t.Errorf("a 10-character prefix: %v %v", n, err)
	}
}

func TestRenderClusterIP(t *testing.T) {
	r := testRenderer(t, model.IPv4, Config{})
	s := clusterSvc("web", model.TCP, "10.96.0.1", 80, "10.0.1.2:8080", "10.0.2.2:8080", "10.0.3.2:8080")
	rd := mustRender(t, r, s)
	h := r.n.serviceHash(s.Port.Name)
	svc := "PROXYKIT-SVC-" + h
	sep := func(e string) string { return r.n.sep(s.Port.Name, e) }
	want := []string{
		`nat PROXYKIT-SERVICES -m comment --comment "default/web/TCP cluster IP" -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -g ` + svc,
	}
	for _, e := range []string{"10.0.1.2", "10.0.2.2", "10.0.3.2"} {
		want = append(want,
			"nat :"+sep(e+":8080"),
			"nat "+sep(e+":8080")+" -s "+e+"/32 -j MARK --or-mark 0x4000",
			"nat "+sep(e+":8080")+" -p tcp -j DNAT --to-destination "+e+":8080")
	}
	want = append(want,
		"nat :"+svc,
		"nat "+svc+" -m statistic --mode random --probability 0.3333333333 -g "+sep("10.0.1.2:8080"),
		"nat "+svc+" -m statistic --mode random --probability 0.5000000000 -g "+sep("10.0.2.2:8080"),
		"nat "+svc+" -g "+sep("10.0.3.2:8080"))
	if got := lines(rd); !slices.Equal(got, want) {
		t.Errorf("rendering:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !rd[tFilter].empty() {
		t.Errorf("filter rules for a service with endpoints: %v", lines(rendering{nil, rd[tFilter]}))
	}
}

func TestRenderNoEndpoints(t *testing.T) {
	r := testRenderer(t, model.IPv4, Config{})
	s := clusterSvc("empty", model.UDP, "10.96.0.2", 53)
	s.Port.NodePort = 30053
	s.Port.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	rd := mustRender(t, r, s)
	want := []string{
		`filter PROXYKIT-SERVICES -m comment --comment "default/empty/UDP has no endpoints" -d 10.96.0.2/32 -p udp -m udp --dport 53 -j REJECT`,
		`filter PROXYKIT-EXTERNAL-SERVICES -m comment --comment "default/empty/UDP has no endpoints" -d 198.51.100.7/32 -p udp -m udp --dport 53 -j REJECT`,
		`filter PROXYKIT-NODEPORTS -m comment --comment "default/empty/UDP has no endpoints" -p udp -m udp --dport 30053 -j REJECT`,
	}
	if got := lines(rd); !slices.Equal(got, want) {
		t.Errorf("rendering:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRenderPolicies(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/16")
	r := testRenderer(t, model.IPv4, Config{Config: proxier.Config{ClusterCIDRs: []netip.Prefix{cidr}}})

	t.Run("ExternalCluster", func(t *testing.T) {
		s := clusterSvc("np", model.TCP, "10.96.1.1", 80, "10.0.1.2:8080")
		s.Port.NodePort = 30080
		rd := mustRender(t, r, s)
		ext := chainsOfKind(rd, kindEXT)
		svc := r.n.chain(kindSVC, r.n.serviceHash(s.Port.Name))
		if len(ext) != 1 || !slices.Equal(ext[0].rules, []string{"-j MARK --or-mark 0x4000", "-g " + svc}) {
			t.Fatalf("EXT chain %+v", ext)
		}
		if len(chainsOfKind(rd, kindXLB)) != 0 {
			t.Error("XLB chain for the same endpoints")
		}
		if !slices.ContainsFunc(rd[tNAT].shared, func(s sharedRule) bool {
			return s.chain == "PROXYKIT-NODEPORTS" && strings.HasSuffix(s.rule, "-p tcp -m tcp --dport 30080 -g "+ext[0].name)
		}) {
			t.Errorf("no node port rule: %v", rd[tNAT].shared)
		}
		// Cluster traffic from outside the cluster CIDR is masqueraded.
		if c := chainsOfKind(rd, kindSVC); c[0].rules[0] != "-d 10.96.1.1/32 -p tcp -m tcp --dport 80 ! -s 10.0.0.0/16 -j MARK --or-mark 0x4000" {
			t.Errorf("SVC chain %v", c[0].rules)
		}
	})

	t.Run("ExternalLocal", func(t *testing.T) {
		s := clusterSvc("local", model.TCP, "10.96.1.2", 80, "10.0.1.2:8080", "10.0.2.2:8080")
		s.Port.NodePort = 30081
		s.Port.ExternalPolicy = model.PolicyLocal
		s.Targets.External = eps("10.0.2.2:8080")
		rd := mustRender(t, r, s)
		h := r.n.serviceHash(s.Port.Name)
		svc, xlb := r.n.chain(kindSVC, h), r.n.chain(kindXLB, h)
		ext := chainsOfKind(rd, kindEXT)
		want := []string{"-s 10.0.0.0/16 -g " + svc, "-m addrtype --src-type LOCAL -j MARK --or-mark 0x4000",
			"-m addrtype --src-type LOCAL -g " + svc, "-g " + xlb}
		if len(ext) != 1 || !slices.Equal(ext[0].rules, want) {
			t.Fatalf("EXT chain %+v, want %v", ext, want)
		}
		x := chainsOfKind(rd, kindXLB)
		if len(x) != 1 || !slices.Equal(x[0].rules, []string{"-g " + r.n.sep(s.Port.Name, "10.0.2.2:8080")}) {
			t.Fatalf("XLB chain %+v", x)
		}
	})

	t.Run("ExternalLocalWithoutLocalEndpoints", func(t *testing.T) {
		s := clusterSvc("local", model.TCP, "10.96.1.3", 80, "10.0.2.2:8080")
		s.Port.NodePort = 30082
		s.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.9")}
		s.Port.ExternalPolicy = model.PolicyLocal
		s.Targets.External = nil
		rd := mustRender(t, r, s)
		want := []string{
			`filter PROXYKIT-EXTERNAL-SERVICES -m comment --comment "default/local/TCP has no local endpoints" -d 203.0.113.9/32 -p tcp -m tcp --dport 80 -j DROP`,
			`filter PROXYKIT-NODEPORTS -m comment --comment "default/local/TCP has no local endpoints" -p tcp -m tcp --dport 30082 -j DROP`,
		}
		var got []string
		for _, l := range lines(rd) {
			if strings.HasPrefix(l, "filter") {
				got = append(got, l)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("filter rules:\n%s", strings.Join(got, "\n"))
		}
		// The EXT chain sends pods and the node to the cluster
		// endpoints; the rest falls through to the DROP rules.
		svc := r.n.chain(kindSVC, r.n.serviceHash(s.Port.Name))
		ext := chainsOfKind(rd, kindEXT)
		wantExt := []string{"-s 10.0.0.0/16 -g " + svc, "-m addrtype --src-type LOCAL -j MARK --or-mark 0x4000",
			"-m addrtype --src-type LOCAL -g " + svc}
		if len(ext) != 1 || !slices.Equal(ext[0].rules, wantExt) {
			t.Errorf("EXT chain %+v, want %v", ext, wantExt)
		}
	})

	t.Run("InternalLocalWithoutLocalEndpoints", func(t *testing.T) {
		s := clusterSvc("itp", model.TCP, "10.96.1.4", 80)
		s.Port.InternalPolicy = model.PolicyLocal
		s.Targets.HasEndpoints = true
		rd := mustRender(t, r, s)
		want := []string{`filter PROXYKIT-SERVICES -m comment --comment "default/itp/TCP has no local endpoints" -d 10.96.1.4/32 -p tcp -m tcp --dport 80 -j DROP`}
		if got := lines(rd); !slices.Equal(got, want) {
			t.Errorf("rendering:\n%s", strings.Join(got, "\n"))
		}
	})

	t.Run("SourceRanges", func(t *testing.T) {
		s := clusterSvc("lb", model.TCP, "10.96.1.5", 80, "10.0.1.2:8080")
		s.Port.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.10")}
		s.Port.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/25"), netip.MustParsePrefix("2001:db8::/64")}
		rd := mustRender(t, r, s)
		h := r.n.serviceHash(s.Port.Name)
		fw, ext := r.n.chain(kindFW, h), r.n.chain(kindEXT, h)
		c := chainsOfKind(rd, kindFW)
		if len(c) != 1 || !slices.Equal(c[0].rules, []string{"-s 192.0.2.0/25 -g " + ext}) {
			t.Fatalf("FW chain %+v", c)
		}
		// A range holding the node's address admits the VIP as a source.
		withNode := *r
		withNode.nodeIP = netip.MustParseAddr("192.0.2.7")
		c = chainsOfKind(mustRender(t, &withNode, s), kindFW)
		if len(c) != 1 || !slices.Equal(c[0].rules, []string{"-s 192.0.2.0/25 -g " + ext, "-s 203.0.113.10/32 -g " + ext}) {
			t.Fatalf("FW chain with the node in a range %+v", c)
		}
		withNode.nodeIP = netip.MustParseAddr("192.0.2.200")
		if c = chainsOfKind(mustRender(t, &withNode, s), kindFW); len(c[0].rules) != 1 {
			t.Fatalf("FW chain with the node outside the ranges %+v", c)
		}
		if !slices.Contains(rd[tNAT].shared, sharedRule{"PROXYKIT-SERVICES", `-m comment --comment "default/lb/TCP loadbalancer IP" -d 203.0.113.10/32 -p tcp -m tcp --dport 80 -j ` + fw}) {
			t.Errorf("no dispatch to FW: %v", rd[tNAT].shared)
		}
		if len(rd[tFilter].shared) != 1 || rd[tFilter].shared[0].chain != "PROXYKIT-FIREWALL" || !strings.HasSuffix(rd[tFilter].shared[0].rule, "-d 203.0.113.10/32 -p tcp -m tcp --dport 80 -j DROP") {
			t.Errorf("firewall drop %v", rd[tFilter].shared)
		}
	})
}

func TestRenderAffinity(t *testing.T) {
	r := testRenderer(t, model.IPv4, Config{})
	s := clusterSvc("sticky", model.TCP, "10.96.2.1", 80, "10.0.1.2:8080", "10.0.2.2:8080")
	s.Port.SessionAffinity = true
	rd := mustRender(t, r, s)
	sep1, sep2 := r.n.sep(s.Port.Name, "10.0.1.2:8080"), r.n.sep(s.Port.Name, "10.0.2.2:8080")
	svc := chainsOfKind(rd, kindSVC)
	want := []string{
		"-m recent --name " + sep1 + " --rcheck --seconds 10800 --reap -g " + sep1,
		"-m recent --name " + sep2 + " --rcheck --seconds 10800 --reap -g " + sep2,
		"-m statistic --mode random --probability 0.5000000000 -g " + sep1,
		"-g " + sep2,
	}
	if len(svc) != 1 || !slices.Equal(svc[0].rules, want) {
		t.Fatalf("SVC chain %+v", svc)
	}
	for _, c := range chainsOfKind(rd, kindSEP) {
		if !strings.Contains(c.rules[1], "-m recent --name "+c.name+" --set -j DNAT") {
			t.Errorf("SEP chain %v", c)
		}
	}
	s.Port = &model.ServicePort{Name: s.Port.Name, ClusterIP: s.Port.ClusterIP, Port: 80, Protocol: model.TCP, SessionAffinity: true, AffinityTimeout: 2e9}
	if c := chainsOfKind(mustRender(t, r, s), kindSVC); !strings.Contains(c[0].rules[0], "--seconds 2 --reap") {
		t.Errorf("timeout 2s: %v", c[0].rules)
	}
}

func TestRenderMasquerade(t *testing.T) {
	s := clusterSvc("m", model.TCP, "10.96.3.1", 80, "10.0.1.2:8080")
	two := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00::/48")}
	for _, tc := range []struct {
		name  string
		cfg   Config
		first string
	}{
		{"none", Config{}, "-m statistic"},
		{"all", Config{Config: proxier.Config{MasqueradeAll: true}}, "-d 10.96.3.1/32 -p tcp -m tcp --dport 80 -j MARK --or-mark 0x4000"},
		{"two CIDRs", Config{Config: proxier.Config{ClusterCIDRs: two}}, "-d 10.96.3.1/32 -p tcp -m tcp --dport 80 -j PROXYKIT-MARK-OUTSIDE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.Targets.Internal = eps("10.0.1.2:8080", "10.0.2.2:8080")
			r := testRenderer(t, model.IPv4, tc.cfg)
			svc := chainsOfKind(mustRender(t, r, s), kindSVC)
			if !strings.HasPrefix(svc[0].rules[0], tc.first) {
				t.Errorf("first SVC rule %q, want %q...", svc[0].rules[0], tc.first)
			}
		})
	}
	r := testRenderer(t, model.IPv4, Config{Config: proxier.Config{ClusterCIDRs: two}, MasqueradeBit: 0x100})
	chains, _ := r.fixedChains(tNAT)
	var outside, post *chainRules
	for i := range chains {
		switch chains[i].name {
		case "PROXYKIT-MARK-OUTSIDE":
			outside = &chains[i]
		case "PROXYKIT-POSTROUTING":
			post = &chains[i]
		}
	}
	if outside == nil || !slices.Equal(outside.rules, []string{"-s 10.0.0.0/16 -j RETURN", "-s 10.1.0.0/16 -j RETURN", "-j MARK --or-mark 0x100"}) {
		t.Errorf("MARK-OUTSIDE %+v", outside)
	}
	if post == nil || post.rules[0] != "-m mark ! --mark 0x100/0x100 -j RETURN" || !strings.HasSuffix(post.rules[2], "-j MASQUERADE --random-fully") {
		t.Errorf("POSTROUTING %+v", post)
	}
}

func TestRenderIPv6(t *testing.T) {
	r := testRenderer(t, model.IPv6, Config{})
	s := clusterSvc("web6", model.SCTP, "fd00:96::1", 7777, "[fd00:1::2]:8082", "10.0.0.1:8082")
	s.Port.NodePort = 30077
	rd := mustRender(t, r, s)
	got := strings.Join(lines(rd), "\n")
	for _, want := range []string{
		"-d fd00:96::1/128 -p sctp -m sctp --dport 7777",
		"-s fd00:1::2/128 -j MARK --or-mark 0x4000",
		"-j DNAT --to-destination [fd00:1::2]:8082",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "10.0.0.1") {
		t.Errorf("an IPv4 endpoint in the IPv6 rendering:\n%s", got)
	}
	_, tail := r.fixedChains(tNAT)
	if len(tail) != 1 || !strings.Contains(tail[0].rule, "! -d ::1/128 -m addrtype --dst-type LOCAL -j PROXYKIT-NODEPORTS") {
		t.Errorf("node port jump %v", tail)
	}
	if _, err := r.service(s.Port.Name, &model.ServicePort{Name: s.Port.Name, ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: model.TCP}, s.Targets); err == nil {
		t.Error("an IPv4 cluster IP was rendered for IPv6")
	}
}

func TestNodePortAddresses(t *testing.T) {
	r := testRenderer(t, model.IPv4, Config{Config: proxier.Config{NodePortAddresses: []netip.Prefix{
		netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64"), netip.MustParsePrefix("198.51.100.1/32")}}})
	_, tail := r.fixedChains(tNAT)
	if len(tail) != 2 || !strings.Contains(tail[0].rule, "-d 192.0.2.0/24 -m addrtype --dst-type LOCAL -j PROXYKIT-NODEPORTS") ||
		!strings.Contains(tail[1].rule, "-d 198.51.100.1/32 -m addrtype") {
		t.Errorf("nat node port jumps %v", tail)
	}
	// The filter rules of node ports (no endpoints, no local ones) hold
	// on every local address, as in kube-proxy.
	_, tail = r.fixedChains(tFilter)
	if len(tail) != 1 || !strings.HasSuffix(tail[0].rule, " -m addrtype --dst-type LOCAL -j PROXYKIT-NODEPORTS") {
		t.Errorf("filter node port jumps %v", tail)
	}
}

// wantOf renders every service port of req.
func wantOf(t *testing.T, b *backend, req *proxier.SyncRequest, only map[model.ServicePortName]struct{}) [numTables]map[model.ServicePortName]*tableRules {
	t.Helper()
	var want [numTables]map[model.ServicePortName]*tableRules
	for tb := range numTables {
		want[tb] = map[model.ServicePortName]*tableRules{}
	}
	for n := range only {
		rd, ok := b.render(req, n, map[model.ServicePortName]error{})
		if !ok {
			t.Fatalf("render %s", n)
		}
		for tb := range numTables {
			want[tb][n] = rd[tb]
		}
	}
	return want
}

func TestPartialInput(t *testing.T) {
	b := offlineBackend(t, model.IPv4, Config{})
	svcs := backendtest.ScaleServices(100, 10)
	empty := clusterSvc("empty", model.TCP, "10.96.200.1", 80)
	svcs = append(svcs, empty)
	full := request(model.IPv4, svcs, nil)
	b.st.svcs = wantOf(t, b, full, full.Changed)
	fullIn := b.fullSections(b.st.svcs, [numTables][]string{}, 0, [numTables]jumpMode{}, false)[0]

	// One endpoint more for one service, and the empty service gains one.
	grown := svcs[50].WithAdded(backendtest.Endpoint("10.200.0.1:8080"))
	filled := clusterSvc("empty", model.TCP, "10.96.200.1", 80, "10.200.0.2:8080")
	filled.Port = empty.Port
	next := slices.Clone(svcs)
	next[50], next[len(next)-1] = grown, filled
	req := request(model.IPv4, next, backendtest.Names(grown, filled))
	in := b.partialInput(wantOf(t, b, req, req.Changed), false, false)
	text := string(in.b)
	if in.lines > 40 || in.lines*20 > fullIn.lines {
		t.Errorf("partial input of %d lines (full: %d):\n%s", in.lines, fullIn.lines, text)
	}
	h := b.r.n.serviceHash(grown.Port.Name)
	for _, want := range []string{
		"*nat\n-D PROXYKIT-CANARY -j RETURN\n-A PROXYKIT-CANARY -j RETURN\n",
		":PROXYKIT-SVC-" + h + " - [0:0]",
		":" + b.r.n.sep(grown.Port.Name, "10.200.0.1:8080") + " - [0:0]",
		"-A PROXYKIT-SVC-" + h + " -m statistic --mode random --probability 0.0909090909 -g ",
		`-I PROXYKIT-SERVICES 1 -m comment --comment "default/empty/TCP cluster IP"`,
		`-D PROXYKIT-SERVICES -m comment --comment "default/empty/TCP has no endpoints"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the partial input:\n%s", want, text)
		}
	}
	// Unchanged endpoint chains are not rewritten, other services not
	// mentioned.
	if strings.Contains(text, b.r.n.sep(grown.Port.Name, grown.Targets.Internal[0].Addr.String())) && strings.Count(text, ":"+b.r.n.sep(grown.Port.Name, grown.Targets.Internal[0].Addr.String())) > 0 {
		t.Errorf("an unchanged endpoint chain is rewritten:\n%s", text)
	}
	if strings.Contains(text, "svc-00049") || strings.Contains(text, b.r.n.serviceHash(svcs[49].Port.Name)) {
		t.Errorf("an unchanged service in the partial input:\n%s", text)
	}
	// Every line maps back to its writer.
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		sp, ok := in.lookup(i + 1)
		switch {
		case strings.Contains(l, h) || strings.Contains(l, "bench/svc-00050"):
			if !ok || sp.kind != spanService || sp.svc != grown.Port.Name {
				t.Errorf("line %d %q maps to %+v", i+1, l, sp)
			}
		case strings.Contains(l, "CANARY"):
			if !ok || sp.kind != spanCanary {
				t.Errorf("line %d %q maps to %+v", i+1, l, sp)
			}
		}
	}

	// Deleting a service deletes its rules and chains, after flushing
	// them.
	b.commit(wantOf(t, b, req, req.Changed), numTables)
	del := request(model.IPv4, slices.Delete(slices.Clone(next), 50, 51), backendtest.Names(grown))
	want := wantOf(t, b, del, nil)
	for tb := range numTables {
		want[tb][grown.Port.Name] = nil
	}
	text = string(b.partialInput(want, false, false).b)
	flush := strings.Index(text, ":PROXYKIT-SVC-"+h+" - [0:0]")
	undispatch := strings.Index(text, "-D PROXYKIT-SERVICES -m comment --comment \"bench/svc-00050:http/TCP cluster IP\"")
	remove := strings.Index(text, "-X PROXYKIT-SVC-"+h)
	if flush < 0 || undispatch < flush || remove < undispatch || strings.Count(text, "\n-X ") != len(b.st.svcs[tNAT][grown.Port.Name].chains) {
		t.Errorf("deletion input:\n%s", text)
	}
}

func TestFullInput(t *testing.T) {
	b := offlineBackend(t, model.IPv4, Config{})
	a := clusterSvc("a", model.TCP, "10.96.0.1", 80, "10.0.1.2:8080")
	a.Port.NodePort = 30080
	z := clusterSvc("z", model.UDP, "10.96.0.2", 53)
	req := request(model.IPv4, []testSvc{a, z}, nil)
	in := b.fullSections(wantOf(t, b, req, req.Changed), [numTables][]string{{"PROXYKIT-SVC-GONE"}, nil}, 0, [numTables]jumpMode{}, false)[0]
	text := string(in.b)
	// Filter first: nat, with the fingerprint rule, commits last.
	filter, nat, _ := strings.Cut(text, "COMMIT\n")
	nat = strings.TrimSuffix(nat, "COMMIT\n")
	for _, c := range []string{"SERVICES", "NODEPORTS", "POSTROUTING", "CANARY"} {
		if !strings.Contains(nat, ":PROXYKIT-"+c+" - [0:0]\n") {
			t.Errorf("nat lacks %s", c)
		}
	}
	for _, c := range []string{"SERVICES", "EXTERNAL-SERVICES", "NODEPORTS", "FIREWALL", "CANARY"} {
		if !strings.Contains(filter, ":PROXYKIT-"+c+" - [0:0]\n") {
			t.Errorf("filter lacks %s", c)
		}
	}
	// The node port jump is the last rule of SERVICES; the stale chain is
	// flushed and deleted at the end.
	natLines := strings.Split(strings.TrimSpace(nat), "\n")
	if !strings.Contains(natLines[len(natLines)-2], "-j PROXYKIT-NODEPORTS") || natLines[len(natLines)-1] != "-X PROXYKIT-SVC-GONE" ||
		!strings.Contains(nat, ":PROXYKIT-SVC-GONE - [0:0]") {
		t.Errorf("nat section:\n%s", nat)
	}
	if !strings.Contains(filter, `default/z/UDP has no endpoints`) {
		t.Errorf("filter section:\n%s", filter)
	}
	sep, h := b.r.n.sep(a.Port.Name, "10.0.1.2:8080"), b.r.n.serviceHash(a.Port.Name)
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		sp, ok := in.lookup(i + 1)
		owned := strings.Contains(l, sep) || strings.Contains(l, h) || strings.Contains(l, "default/a/TCP")
		if owned != (ok && sp.kind == spanService && sp.svc == a.Port.Name) {
			t.Errorf("line %d %q maps to %+v", i+1, l, sp)
		}
	}
	if in.committedBefore(tNAT, in.tableEnd[tFilter]+1) || !in.committedBefore(tFilter, in.tableEnd[tFilter]+1) {
		t.Error("committedBefore")
	}
}

func TestJumps(t *testing.T) {
	r := testRenderer(t, model.IPv4, Config{ChainPrefix: "PK1"})
	got := map[string][]string{}
	for _, j := range r.jumps() {
		k := j.table.String() + " " + j.chain
		got[k] = append(got[k], j.rule[len(j.rule)-1])
	}
	want := map[string][]string{
		"nat PREROUTING":  {"PK1-SERVICES"},
		"nat OUTPUT":      {"PK1-SERVICES"},
		"nat POSTROUTING": {"PK1-POSTROUTING"},
		"filter INPUT":    {"PK1-FIREWALL", "PK1-EXTERNAL-SERVICES"},
		"filter FORWARD":  {"PK1-FIREWALL", "PK1-SERVICES", "PK1-EXTERNAL-SERVICES"},
		"filter OUTPUT":   {"PK1-FIREWALL", "PK1-SERVICES"},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("jumps %v", got)
	}
}

func TestParseSave(t *testing.T) {
	b := offlineBackend(t, model.IPv4, Config{})
	save := []byte(fmt.Sprintf(`# Generated by iptables-save
*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:OTHER - [0:0]
:PROXYKIT-SERVICES - [0:0]
-A INPUT -s 192.0.2.99/32 -j ACCEPT
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "proxykit service portals" -j PROXYKIT-SERVICES
-A OTHER -g PROXYKIT-SERVICES
-A PROXYKIT-SERVICES -j REJECT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
%s
COMMIT
`, "-A PREROUTING -j DNAT --to-destination 10.0.0.1"))
	tables := b.r.n.parseSave(save)
	if len(tables) != 2 {
		t.Fatalf("%d tables", len(tables))
	}
	f := tables[0]
	if f.name != "filter" || !slices.Equal(f.ours, []string{"PROXYKIT-SERVICES"}) || len(f.jumps) != 2 ||
		f.builtin["INPUT"] != "DROP" || f.others["INPUT"] != 1 || f.others["FORWARD"] != 0 {
		t.Errorf("filter %+v", f)
	}
	if n := tables[1]; len(n.ours) != 0 || len(n.jumps) != 0 || n.others["PREROUTING"] != 1 {
		t.Errorf("nat %+v", n)
	}
}

func TestFullSectionsChunked(t *testing.T) {
	two := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.1.0.0/16")}
	b := offlineBackend(t, model.IPv4, Config{Config: proxier.Config{ClusterCIDRs: two}})
	svcs := backendtest.ScaleServices(300, 10)
	req := request(model.IPv4, svcs, nil)
	want := wantOf(t, b, req, req.Changed)
	const chunk = 500
	secs := b.fullSections(want, [numTables][]string{{"PROXYKIT-SVC-GONE"}, nil}, chunk, [numTables]jumpMode{}, false)
	if len(secs) < 5 {
		t.Fatalf("%d sections", len(secs))
	}
	// The first section makes the chains every service's chains jump to.
	if pre := string(secs[0].b); !strings.Contains(pre, ":PROXYKIT-MARK-OUTSIDE - [0:0]\n-A PROXYKIT-MARK-OUTSIDE -s 10.0.0.0/16 -j RETURN\n") {
		t.Fatalf("first section:\n%s", pre)
	}
	declared := map[string]int{}
	for _, in := range secs[1 : len(secs)-1] {
		text := string(in.b)
		if !strings.HasPrefix(text, "*nat\n") || strings.Count(text, "COMMIT\n") != 1 || strings.Contains(text, "PROXYKIT-SERVICES") {
			t.Fatalf("chunk section:\n%.500s", text)
		}
		n := strings.Count(text, "\n:")
		if n > chunk+12 {
			t.Errorf("a section declares %d chains", n)
		}
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, ":") {
				declared[strings.Fields(l[1:])[0]]++
			}
		}
	}
	for _, tr := range want[tNAT] {
		for _, c := range tr.chains {
			if declared[c.name] != 1 {
				t.Fatalf("chain %s declared %d times", c.name, declared[c.name])
			}
		}
	}
	// The last section holds the dispatch rules, targets in descending
	// order, the node port jump last, and the stale chain's deletion.
	last := string(secs[len(secs)-1].b)
	var targets []string
	for _, l := range strings.Split(last, "\n") {
		if strings.HasPrefix(l, "-A PROXYKIT-SERVICES ") {
			targets = append(targets, jumpTarget(l))
		}
	}
	if len(targets) != 301 || targets[300] != "PROXYKIT-NODEPORTS" || !slices.IsSortedFunc(targets[:300], func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("dispatch targets %v", targets)
	}
	if strings.Contains(last, "PROXYKIT-MARK-OUTSIDE - [0:0]") || !strings.HasSuffix(last, "-X PROXYKIT-SVC-GONE\nCOMMIT\n") {
		t.Errorf("last section:\n%.2000s", last)
	}
	// Lines map back through the joined input.
	data, starts := joinSections(secs)
	if starts[len(starts)-1] != strings.Count(string(data), "\n") {
		t.Fatalf("line count %d", starts[len(starts)-1])
	}
	in := secs[2]
	sp, ok := in.lookup(3)
	if !ok || sp.kind != spanService || !slices.Contains(in.svcs, sp.svc) {
		t.Errorf("line 3 of section 2 maps to %+v", sp)
	}
}
