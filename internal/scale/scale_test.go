package scale

import (
	"net/netip"
	"strings"
	"testing"
)

func TestServicesUnique(t *testing.T) {
	svcs := Services(30000, 10)
	ips := map[netip.Addr]bool{TargetIP: true}
	eps := map[netip.Addr]bool{}
	ports := map[uint16]bool{}
	for _, s := range svcs {
		if ips[s.ClusterIP] {
			t.Fatalf("%s: cluster IP %s used twice", s.Name, s.ClusterIP)
		}
		ips[s.ClusterIP] = true
		if !netip.MustParsePrefix("10.96.0.0/16").Contains(s.ClusterIP) {
			t.Fatalf("%s: cluster IP %s", s.Name, s.ClusterIP)
		}
		for _, e := range s.Endpoints {
			if eps[e] || !netip.MustParsePrefix("10.64.0.0/13").Contains(e) {
				t.Fatalf("%s: endpoint %s reused or out of range", s.Name, e)
			}
			eps[e] = true
		}
		if s.NodePort != 0 {
			if ports[s.NodePort] || s.NodePort < 30000 || s.NodePort > 32767 {
				t.Fatalf("%s: node port %d reused or out of range", s.Name, s.NodePort)
			}
			ports[s.NodePort] = true
		}
	}
	if len(ports) != MaxNodePorts {
		t.Errorf("%d node ports, want %d", len(ports), MaxNodePorts)
	}
}

func TestChangeWalksServices(t *testing.T) {
	svcs := Services(100, 10)
	seen := map[int]bool{}
	for k := range 100 {
		idx, upd := Change(svcs, k)
		if seen[idx] {
			t.Fatalf("change %d: service %d changed twice", k, idx)
		}
		seen[idx] = true
		if upd.Endpoints[0] != ReplacementEndpoint(k) || upd.Endpoints[1] != svcs[idx].Endpoints[1] || svcs[idx].Endpoints[0] == upd.Endpoints[0] {
			t.Fatalf("change %d: %v -> %v", k, svcs[idx].Endpoints, upd.Endpoints)
		}
	}
}

func TestObjects(t *testing.T) {
	svcs := append(Services(20, 3), Target("node1", netip.MustParseAddr("10.244.1.2")))
	objs, slices := Objects(svcs)
	if len(objs) != 21 || len(slices) != 21 {
		t.Fatalf("%d services, %d slices", len(objs), len(slices))
	}
	if objs[10].Spec.Ports[0].NodePort != 30001 || objs[10].Spec.Type != "NodePort" {
		t.Errorf("service 10: %+v", objs[10].Spec)
	}
	last := slices[20]
	if last.Labels["kubernetes.io/service-name"] != TargetName || len(last.Endpoints) != 1 || *last.Endpoints[0].NodeName != "node1" {
		t.Errorf("target slice: %+v", last)
	}
}

func TestKubeProxyNFT(t *testing.T) {
	svcs := Services(20, 3)
	s := KubeProxyNFT(svcs)
	// Per service: 3 endpoint chains and the service chain; every
	// tenth also an external chain; plus the 6 fixed NAT chains and
	// the filter side's 5 base chains, 4 check chains and reject-chain.
	if n := strings.Count(s, "add chain "); n != 20*4+2+6+10 {
		t.Errorf("%d chains", n)
	}
	upd := svcs[5].WithEndpoint(0, ReplacementEndpoint(0))
	tx := KubeProxyNFTChange(svcs[5], upd)
	if strings.Count(tx, "add chain ") != 1 || strings.Count(tx, "delete chain ") != 1 || !strings.Contains(tx, "flush chain ") {
		t.Errorf("change:\n%s", tx)
	}
	if !strings.Contains(tx, svcs[5].nftEndpointChain(svcs[5].Endpoints[0])) || !strings.Contains(s, svcs[5].nftEndpointChain(svcs[5].Endpoints[0])) {
		t.Errorf("the removed endpoint's chain is not the one created")
	}
}

func TestKubeProxyIPTables(t *testing.T) {
	svcs := Services(20, 3)
	s := KubeProxyIPTables(svcs)
	if n := strings.Count(s, "-j DNAT"); n != 60 {
		t.Errorf("%d DNAT rules", n)
	}
	if n := strings.Count(s, "--probability"); n != 40 {
		t.Errorf("%d probability rules", n)
	}
	if !strings.HasPrefix(s, "*filter\n") || !strings.Contains(s, "COMMIT\n*nat\n") || !strings.HasSuffix(s, "COMMIT\n") {
		t.Errorf("not a restore input of the filter and nat tables")
	}
	if n := strings.Count(s, "-m conntrack --ctstate NEW "); n != 7 {
		t.Errorf("%d jumps for new connections, want 7 (kube-proxy's filter jumps)", n)
	}
	upd := svcs[5].WithEndpoint(0, ReplacementEndpoint(0))
	after := append([]Service(nil), svcs...)
	after[5] = upd
	tx := KubeProxyIPTablesChange(after, svcs[5], upd)
	old := svcs[5].iptSepChain(svcs[5].Endpoints[0])
	if !strings.Contains(tx, ":"+old+" - [0:0]\n") || !strings.Contains(tx, "-X "+old+"\n") {
		t.Errorf("the removed endpoint's chain is not flushed and deleted:\n%s", tx)
	}
	if !strings.HasPrefix(tx, "*filter\n:KUBE-SERVICES - [0:0]\n") || strings.Contains(tx, "-A FORWARD ") {
		t.Errorf("the partial sync does not rewrite the filter chains alone:\n%.1500s", tx)
	}
	if n := strings.Count(tx, "-A KUBE-SERVICES "); n != 21 {
		t.Errorf("KUBE-SERVICES rewritten with %d rules, want 21", n)
	}
}

// TestSlicesSplit: a service's endpoints go into EndpointSlices of at
// most MaxSliceEndpoints, in order, each named apart; up to that many,
// one slice named as before.
func TestSlicesSplit(t *testing.T) {
	for _, c := range []struct{ eps, slices, last int }{{0, 1, 0}, {3, 1, 3}, {100, 1, 100}, {101, 2, 1}, {1000, 10, 100}, {10000, 100, 100}} {
		s := Services(1, c.eps)[0]
		got := s.Slices(4)
		if len(got) != c.slices || s.NumSlices() != c.slices {
			t.Fatalf("%d endpoints: %d slices (NumSlices %d), want %d", c.eps, len(got), s.NumSlices(), c.slices)
		}
		if len(got[len(got)-1].Endpoints) != c.last {
			t.Errorf("%d endpoints: the last slice holds %d, want %d", c.eps, len(got[len(got)-1].Endpoints), c.last)
		}
		names := map[string]bool{}
		j := 0
		for k, sl := range got {
			if len(sl.Endpoints) > MaxSliceEndpoints || names[sl.Name] || sl.ResourceVersion != "5" || sl.Labels["kubernetes.io/service-name"] != s.Name {
				t.Fatalf("%d endpoints: slice %d %s: %d endpoints, version %s, labels %v", c.eps, k, sl.Name, len(sl.Endpoints), sl.ResourceVersion, sl.Labels)
			}
			names[sl.Name] = true
			for _, e := range sl.Endpoints {
				if e.Addresses[0] != s.Endpoints[j].String() {
					t.Fatalf("%d endpoints: slice %d holds %s where endpoint %d, %s, belongs", c.eps, k, e.Addresses[0], j, s.Endpoints[j])
				}
				j++
			}
		}
		if first := s.Slice(4); first.Name != "svc-00000-bench" || len(first.Endpoints) != len(got[0].Endpoints) {
			t.Errorf("%d endpoints: Slice is %s with %d endpoints, want the first of Slices", c.eps, first.Name, len(first.Endpoints))
		}
	}
	objs, slices := Objects(Services(3, 250))
	if len(objs) != 3 || len(slices) != 9 || slices[3].Labels["kubernetes.io/service-name"] != "svc-00001" {
		t.Errorf("Objects of 3 services of 250 endpoints: %d services, %d slices", len(objs), len(slices))
	}
}

// TestServicesAtMaxima: the largest sizes stay within their ranges and
// clear of the measured service's address.
func TestServicesAtMaxima(t *testing.T) {
	last := Services(MaxServices, 0)[MaxServices-1]
	if !netip.MustParsePrefix("10.96.0.0/14").Contains(last.ClusterIP) || last.ClusterIP.Compare(TargetIP) >= 0 {
		t.Errorf("service %d: cluster IP %s", MaxServices-1, last.ClusterIP)
	}
	eps := Services(1, MaxEndpoints)[0].Endpoints
	if e := eps[len(eps)-1]; !netip.MustParsePrefix("10.64.0.0/12").Contains(e) {
		t.Errorf("endpoint %d: %s", MaxEndpoints-1, e)
	}
}
