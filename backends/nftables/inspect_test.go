package nftables

import (
	"errors"
	"io/fs"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/model"
)

// TestReadTable programs services and reads the table back: the routes
// of the dispatch maps reach the endpoints (every one, one recorded for a
// client under session affinity), a service without endpoints goes to
// the reject chain, base chains carry their hooks and rules print as
// text. A family without a table is fs.ErrNotExist.
func TestReadTable(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	b := newTestBackend(t, ns, model.IPv4, Config{})
	web := clusterSvc("web", model.TCP, "10.96.0.10", 80, pod1v4, pod2v4)
	empty := clusterSvc("empty", model.TCP, "10.96.0.11", 80)
	sticky := clusterSvc("sticky", model.UDP, "10.96.0.12", 53, pod1u4).With(func(sp *model.ServicePort) {
		sp.SessionAffinity, sp.AffinityTimeout = true, time.Hour
	})
	mustSync(t, b, request(model.IPv4, []testSvc{web, empty, sticky}, nil))

	if _, err := ReadTable(t.Context(), ns.path, model.IPv6, ""); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a family without a table: %v, want fs.ErrNotExist", err)
	}
	tbl, err := ReadTable(t.Context(), ns.path, model.IPv4, "")
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Name != DefaultTableName || tbl.Family != model.IPv4 {
		t.Errorf("table %s %v", tbl.Name, tbl.Family)
	}

	var routes []Route
	for _, r := range tbl.Routes {
		if r.Map != setServiceIPs {
			t.Errorf("route of map %s: %+v", r.Map, r)
			continue
		}
		if r.Chain == "" || r.Verdict != "goto "+r.Chain {
			t.Errorf("route %+v: verdict and chain", r)
		}
		r.Chain, r.Verdict = "", ""
		routes = append(routes, r)
	}
	want := []Route{
		{Map: setServiceIPs, Key: "10.96.0.10 . tcp . 80", Endpoints: []netip.AddrPort{ap(pod1v4), ap(pod2v4)}},
		{Map: setServiceIPs, Key: "10.96.0.12 . udp . 53", Endpoints: []netip.AddrPort{ap(pod1u4)}, Affinity: true},
	}
	if d := cmp.Diff(want, routes, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); d != "" {
		t.Errorf("routes (-want +got):\n%s", d)
	}

	i := slices.IndexFunc(tbl.Sets, func(s Set) bool { return s.Name == setNoEndpointIPs })
	if i < 0 || !cmp.Equal(tbl.Sets[i].Elements, []Element{{Key: "10.96.0.11 . tcp . 80", Data: "goto " + chainReject}}) {
		t.Errorf("sets %+v", tbl.Sets)
	} else if s := tbl.Sets[i]; s.Type != "ipv4_addr . inet_proto . inet_service" || s.DataType != "verdict" {
		t.Errorf("set %s: type %q : %q", s.Name, s.Type, s.DataType)
	}

	i = slices.IndexFunc(tbl.Chains, func(c Chain) bool { return c.Name == chainNATPrerouting })
	if i < 0 {
		t.Fatalf("no chain %s in %+v", chainNATPrerouting, tbl.Chains)
	}
	if c := tbl.Chains[i]; c.Hook != "prerouting" || c.Priority != prioDNAT || c.Policy != "accept" || len(c.Rules) == 0 {
		t.Errorf("chain %+v", c)
	}
	for _, c := range tbl.Chains {
		for _, r := range c.Rules {
			if !strings.HasPrefix(r, "[ ") || strings.Contains(r, "#") {
				t.Errorf("chain %s: rule %q", c.Name, r)
			}
		}
	}
}
