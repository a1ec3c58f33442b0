package ipvs

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

func elemStrings(es []elem) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.String())
	}
	return out
}

func TestRenderClusterIP(t *testing.T) {
	s := clusterSvc("web", model.TCP, "10.96.0.10", 80, "10.244.1.3:8080", "10.244.1.2:8080", "10.244.1.2:8080")
	o, err := testRenderer(model.IPv4).render(s.Port, s.Targets)
	if err != nil {
		t.Fatal(err)
	}
	want := []vsSpec{{
		Key:   vsKey{netip.MustParseAddr("10.96.0.10"), model.TCP, 80},
		Kind:  kindCluster,
		Sched: "rr",
		Dests: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:8080"), netip.MustParseAddrPort("10.244.1.3:8080")},
	}}
	if diff := cmp.Diff(want, o.VS, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	if got := o.Addrs; len(got) != 1 || got[0] != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("addresses = %v", got)
	}
	wantElems := []string{
		"cluster 10.96.0.10:80/TCP",
		"hairpin 10.244.1.2 . 10.244.1.2",
		"hairpin 10.244.1.3 . 10.244.1.3",
		"service-addrs 10.96.0.10",
		"virtual 10.96.0.10:80/TCP",
	}
	if diff := cmp.Diff(wantElems, elemStrings(o.Elems)); diff != "" {
		t.Errorf("elements (-want +got):\n%s", diff)
	}
}

func TestRenderExternalAndNodePorts(t *testing.T) {
	s := clusterSvc("lb", model.UDP, "10.96.0.11", 53, "10.244.1.2:5353").With(func(sp *model.ServicePort) {
		sp.NodePort = 30053
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.5")}
		sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("203.0.113.5")}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	})
	o, err := testRenderer(model.IPv4, "192.0.2.1", "198.51.100.1").render(s.Port, s.Targets)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, v := range o.VS {
		keys = append(keys, v.Key.String())
		if len(v.Dests) != 1 {
			t.Errorf("%s has real servers %v", v.Key, v.Dests)
		}
	}
	wantKeys := []string{"10.96.0.11:53/UDP", "192.0.2.1:30053/UDP", "198.51.100.1:30053/UDP", "203.0.113.5:53/UDP", "203.0.113.9:53/UDP"}
	if diff := cmp.Diff(wantKeys, keys); diff != "" {
		t.Errorf("virtual servers (-want +got):\n%s", diff)
	}
	// Node addresses are not bound on the dummy interface.
	if diff := cmp.Diff([]string{"10.96.0.11", "203.0.113.5", "203.0.113.9"}, addrStrings(o.Addrs)); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	got := strings.Join(elemStrings(o.Elems), "\n")
	for _, want := range []string{
		"masq-external 192.0.2.1:30053/UDP",
		"masq-external 203.0.113.9:53/UDP",
		"firewall 203.0.113.9:53/UDP",
		"firewall-allow 203.0.113.9:53/UDP . 198.51.100.0/24",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("elements lack %q:\n%s", want, got)
		}
	}
	for _, bad := range []string{"2001:db8", "masq-external 10.96.0.11", "reject", "drop"} {
		if strings.Contains(got, bad) {
			t.Errorf("elements hold %q:\n%s", bad, got)
		}
	}
	// 203.0.113.5 is both an external and a load-balancer IP: one
	// virtual server, of the first kind (external IPs have no firewall).
	if strings.Contains(got, "firewall 203.0.113.5") {
		t.Errorf("the external IP got the load balancer's firewall:\n%s", got)
	}
}

func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

func TestRenderPolicies(t *testing.T) {
	base := clusterSvc("p", model.TCP, "10.96.0.12", 80).With(func(sp *model.ServicePort) { sp.NodePort = 30080 })
	for _, tc := range []struct {
		name string
		s    svc
		want []string
		not  []string
	}{
		{"no endpoints rejects everywhere", base.WithTargets(nil, nil, false),
			[]string{"reject 10.96.0.12:80/TCP", "reject 192.0.2.1:30080/TCP"}, []string{"drop"}},
		{"internal local without local endpoints drops cluster traffic", base.WithTargets(nil, eps("10.244.2.2:80"), true),
			[]string{"drop 10.96.0.12:80/TCP"}, []string{"reject", "drop 192.0.2.1"}},
		{"external local without local endpoints drops external traffic, unmasqueraded",
			base.With(func(sp *model.ServicePort) { sp.ExternalPolicy = model.PolicyLocal }).WithTargets(eps("10.244.2.2:80"), nil, true),
			[]string{"drop 192.0.2.1:30080/TCP"}, []string{"reject", "drop 10.96.0.12", "masq-external"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := testRenderer(model.IPv4, "192.0.2.1").render(tc.s.Port, tc.s.Targets)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(elemStrings(o.Elems), "\n")
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("lacks %q:\n%s", w, got)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("holds %q:\n%s", n, got)
				}
			}
		})
	}
}

func TestRenderAffinity(t *testing.T) {
	s := clusterSvc("a", model.TCP, "fd00:10:96::1", 80, "[fd00:10:244:1::2]:80")
	for _, tc := range []struct {
		timeout time.Duration
		want    uint32
	}{{0, 10800}, {1500 * time.Millisecond, 2}, {time.Hour, 3600}} {
		sp := s.With(func(sp *model.ServicePort) { sp.SessionAffinity, sp.AffinityTimeout = true, tc.timeout })
		o, err := testRenderer(model.IPv6).render(sp.Port, sp.Targets)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.VS[0].Timeout; got != tc.want {
			t.Errorf("timeout %v: persistence %ds, want %ds", tc.timeout, got, tc.want)
		}
	}
	o, _ := testRenderer(model.IPv6).render(s.Port, s.Targets)
	if o.VS[0].Timeout != 0 {
		t.Errorf("no affinity: persistence %ds", o.VS[0].Timeout)
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	s := clusterSvc("x", model.TCP, "10.96.0.1", 80, "10.244.1.2:80")
	if _, err := testRenderer(model.IPv6).render(s.Port, s.Targets); err == nil {
		t.Error("IPv4 cluster IP rendered for IPv6")
	}
	bad := s.With(func(sp *model.ServicePort) { sp.Protocol = "ICMP" })
	if _, err := testRenderer(model.IPv4).render(bad.Port, bad.Targets); err == nil {
		t.Error("invalid protocol rendered")
	}
}

func TestSchedulerValidation(t *testing.T) {
	for _, s := range Schedulers() {
		c := Config{Scheduler: s}.WithDefaults()
		if err := c.validate(); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, c := range []Config{{Scheduler: "fifo"}, {Scheduler: proxier.SchedulerRandom}, {MasqueradeBit: 3}, {InterfaceName: "a-name-longer-than-15"}} {
		c = c.WithDefaults()
		err := c.validate()
		if err == nil {
			t.Errorf("%+v validated", c)
		}
		// A scheduler the backend does not implement is the project's
		// one "unsupported" error.
		if c.Scheduler != "rr" && !errors.Is(err, proxier.ErrNotSupported) {
			t.Errorf("scheduler %q: %v, want an error matching ErrNotSupported", c.Scheduler, err)
		}
	}
	// Cilium's name of Maglev hashing is IPVS's mh.
	if c := (Config{Scheduler: " Maglev"}).WithDefaults(); c.validate() != nil || c.Scheduler != proxier.SchedulerMaglev {
		t.Errorf("maglev: %q", c.Scheduler)
	}
	if d := (Config{}).WithDefaults(); d.Scheduler != "rr" || d.InterfaceName != DefaultInterfaceName || !slices.Contains(Schedulers(), d.Scheduler) {
		t.Errorf("defaults: %+v", d)
	}
}

func TestServiceScheduler(t *testing.T) {
	for _, c := range []struct{ annotated, want string }{{"", "rr"}, {"rr", "rr"}, {"sh", "sh"}, {"mh", "mh"}, {"maglev", "mh"}, {"random", "rr"}, {"fifo", "rr"}} {
		s := clusterSvc("web", model.TCP, "10.96.0.1", 80).With(func(sp *model.ServicePort) {
			sp.Scheduler = c.annotated
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
		})
		o, err := testRenderer(model.IPv4).render(s.Port, s.Targets)
		if err != nil {
			t.Fatal(err)
		}
		if len(o.VS) != 2 {
			t.Fatalf("%q: %d virtual servers, want 2", c.annotated, len(o.VS))
		}
		for _, vs := range o.VS {
			if vs.Sched != c.want {
				t.Errorf("scheduler %q: virtual server %v has %q, want %q", c.annotated, vs.Key, vs.Sched, c.want)
			}
		}
	}
}
