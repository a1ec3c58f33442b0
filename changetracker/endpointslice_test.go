package changetracker

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

func TestEndpointSliceConversion(t *testing.T) {
	var (
		http    = []discoveryv1.EndpointPort{eport("http", v1.ProtocolTCP, 8080)}
		httpA   = spn("a", "http", model.TCP)
		v6Slice = func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice { return v6(s) }
	)
	type want = map[model.ServicePortName][]*model.Endpoint
	tests := []struct {
		name   string
		family model.IPFamily // default IPv4
		slices []*discoveryv1.EndpointSlice
		want   want
	}{{
		name:   "one slice, endpoints sorted",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", http, ep("10.1.0.10"), ep("10.1.0.9"), ep("10.1.0.2"))},
		want:   want{httpA: {mep("10.1.0.2:8080"), mep("10.1.0.9:8080"), mep("10.1.0.10:8080")}},
	}, {
		name: "conditions",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", http,
			ep("10.1.0.1", nil, nil, nil),
			ep("10.1.0.2", fls, nil, nil),
			ep("10.1.0.3", fls, tru, tru),
			ep("10.1.0.4", fls, fls, tru),
			ep("10.1.0.5", tru, fls, tru), // contradictory: Ready wins
			ep("10.1.0.6", fls, tru, nil),
		)},
		want: want{httpA: {
			mep("10.1.0.1:8080"),
			mep("10.1.0.2:8080", notServing),
			mep("10.1.0.3:8080", terminatingServing),
			mep("10.1.0.4:8080", notServing, func(e *model.Endpoint) { e.Terminating = true }),
			mep("10.1.0.5:8080"),
			mep("10.1.0.6:8080", notReady),
		}},
	}, {
		name: "node, zone, hints",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", http,
			onNode("node1", ep("10.1.0.1")),
			onNode("node2", ep("10.1.0.2")),
			func() discoveryv1.Endpoint {
				e := ep("10.1.0.3")
				e.Zone = ptr("z1")
				e.Hints = &discoveryv1.EndpointHints{
					ForZones: []discoveryv1.ForZone{{Name: "z1"}, {Name: "z2"}},
					ForNodes: []discoveryv1.ForNode{{Name: "node3"}},
				}
				return e
			}(),
			func() discoveryv1.Endpoint {
				e := ep("10.1.0.4")
				e.Hints = &discoveryv1.EndpointHints{} // no hints
				return e
			}(),
		)},
		want: want{httpA: {
			mep("10.1.0.1:8080", local),
			mep("10.1.0.2:8080", node("node2")),
			mep("10.1.0.3:8080", zone("z1"), zoneHints("z1", "z2"), nodeHints("node3")),
			mep("10.1.0.4:8080"),
		}},
	}, {
		name: "several ports and defaults: nil protocol is TCP, nil name is unnamed",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", []discoveryv1.EndpointPort{
			{Port: ptr(int32(80))},
			eport("dns", v1.ProtocolUDP, 53),
			eport("dns", v1.ProtocolTCP, 53),
			eport("dns", v1.ProtocolTCP, 53), // duplicate
			{Name: ptr("noport")},
			eport("zero", v1.ProtocolTCP, 0),
			eport("big", v1.ProtocolTCP, 65536),
			eport("icmp", "ICMP", 1),
		}, ep("10.1.0.1"))},
		want: want{
			spn("a", "", model.TCP):    {mep("10.1.0.1:80")},
			spn("a", "dns", model.UDP): {mep("10.1.0.1:53")},
			spn("a", "dns", model.TCP): {mep("10.1.0.1:53")},
		},
	}, {
		name: "one port name with two numbers",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", []discoveryv1.EndpointPort{
			eport("p", v1.ProtocolTCP, 80), eport("p", v1.ProtocolTCP, 81),
		}, ep("10.1.0.1"))},
		want: want{spn("a", "p", model.TCP): {mep("10.1.0.1:80"), mep("10.1.0.1:81")}},
	}, {
		name: "slices of one service merge and de-duplicate",
		slices: []*discoveryv1.EndpointSlice{
			slice("s1", "a", http, ep("10.1.0.1"), ep("10.1.0.3")),
			slice("s2", "a", http, ep("10.1.0.2"), ep("10.1.0.3")),
		},
		want: want{httpA: {mep("10.1.0.1:8080"), mep("10.1.0.2:8080"), mep("10.1.0.3:8080")}},
	}, {
		name: "duplicate: ready wins over not ready, whatever the slice order",
		slices: []*discoveryv1.EndpointSlice{
			slice("s1", "a", http, onNode("n1", ep("10.1.0.1", fls, fls, tru))),
			slice("s2", "a", http, onNode("n2", ep("10.1.0.1"))),
			slice("s3", "a", http, onNode("n3", ep("10.1.0.1", fls, tru, tru))),
		},
		want: want{httpA: {mep("10.1.0.1:8080", node("n2"))}},
	}, {
		name: "duplicate: serving wins over not serving",
		slices: []*discoveryv1.EndpointSlice{
			slice("s1", "a", http, onNode("n1", ep("10.1.0.1", fls, fls, tru))),
			slice("s2", "a", http, onNode("n2", ep("10.1.0.1", fls, tru, tru))),
		},
		want: want{httpA: {mep("10.1.0.1:8080", node("n2"), terminatingServing)}},
	}, {
		name: "duplicate of equal rank: the smaller slice name wins",
		slices: []*discoveryv1.EndpointSlice{
			slice("s2", "a", http, onNode("n2", ep("10.1.0.1"))),
			slice("s1", "a", http, onNode("n1", ep("10.1.0.1"))),
		},
		want: want{httpA: {mep("10.1.0.1:8080", node("n1"))}},
	}, {
		name: "duplicate within a slice: the first wins",
		slices: []*discoveryv1.EndpointSlice{
			slice("s1", "a", http, onNode("n1", ep("10.1.0.1")), onNode("n2", ep("10.1.0.1"))),
		},
		want: want{httpA: {mep("10.1.0.1:8080", node("n1"))}},
	}, {
		name: "slices of different services stay apart",
		slices: []*discoveryv1.EndpointSlice{
			slice("s1", "a", http, ep("10.1.0.1")),
			slice("s2", "b", http, ep("10.1.0.1")),
		},
		want: want{httpA: {mep("10.1.0.1:8080")}, spn("b", "http", model.TCP): {mep("10.1.0.1:8080")}},
	}, {
		name:   "slice without service label ignored",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "", http, ep("10.1.0.1"))},
		want:   want{},
	}, {
		name: "FQDN slice ignored",
		slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			s := slice("s1", "a", http, ep("example.com"))
			s.AddressType = discoveryv1.AddressTypeFQDN
			return s
		}()},
		want: want{},
	}, {
		name: "unknown address type ignored",
		slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			s := slice("s1", "a", http, ep("10.1.0.1"))
			s.AddressType = "IPv5"
			return s
		}()},
		want: want{},
	}, {
		name:   "IPv6 slice ignored by the IPv4 tracker",
		slices: []*discoveryv1.EndpointSlice{v6Slice(slice("s1", "a", http, ep("fd01::1")))},
		want:   want{},
	}, {
		name:   "IPv6 loopback, link-local and multicast endpoints dropped",
		family: model.IPv6,
		slices: []*discoveryv1.EndpointSlice{v6Slice(slice("s1", "a", http, ep("::1"), ep("ff02::1"), ep("ff05::2"), ep("fe80::1"), ep("fd01::2")))},
		want:   want{httpA: {mep("[fd01::2]:8080")}},
	}, {
		name:   "IPv6 slice, IPv6 tracker",
		family: model.IPv6,
		slices: []*discoveryv1.EndpointSlice{
			v6Slice(slice("s1", "a", http, ep("fd01::2"), ep("fd01::1"))),
			slice("s2", "a", http, ep("10.1.0.1")),
		},
		want: want{httpA: {mep("[fd01::1]:8080"), mep("[fd01::2]:8080")}},
	}, {
		name: "bad, loopback, link-local, multicast and broadcast addresses dropped, others kept",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", http,
			ep("fd01::1"), ep("bogus"), ep("0.0.0.0"), ep("10.1.0.1"),
			ep("127.0.0.1"), ep("224.0.0.5"), ep("239.1.2.3"), ep("169.254.0.9"), ep("255.255.255.255"),
			discoveryv1.Endpoint{}, // no address
			discoveryv1.Endpoint{Addresses: []string{"10.1.0.2", "10.1.0.99"}},
		)},
		want: want{httpA: {mep("10.1.0.1:8080"), mep("10.1.0.2:8080")}},
	}, {
		name:   "slice without valid port contributes nothing",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", []discoveryv1.EndpointPort{{Name: ptr("x")}}, ep("10.1.0.1"))},
		want:   want{},
	}, {
		name:   "slice without endpoints contributes nothing",
		slices: []*discoveryv1.EndpointSlice{slice("s1", "a", http)},
		want:   want{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := tt.family
			if fam == 0 {
				fam = model.IPv4
			}
			tr := newTracker(t, fam)
			for _, s := range tt.slices {
				tr.OnEndpointSlice(s, false)
			}
			res := tr.Apply()
			if diff := cmp.Diff(tt.want, tr.State().Endpoints, cmpOpts); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			wantChanged := changed()
			for n := range tt.want {
				wantChanged[n] = struct{}{}
			}
			if diff := cmp.Diff(wantChanged, res.Changed); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			if len(tr.State().Services) != 0 {
				t.Errorf("services appeared: %v", tr.State().Services)
			}
		})
	}
}
