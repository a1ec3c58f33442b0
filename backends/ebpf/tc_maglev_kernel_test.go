package ebpf

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCMaglev: a service port whose scheduler is Maglev picks, for a
// new flow from outside, the endpoint its group's table holds for the
// flow's tuple (the table built from the endpoints alone, so every node
// with the same endpoints picks the same one), at tc and with XDP in
// front; a service port of the proxier's random selection does not use a
// table. 24 UDP flows of distinct source ports each reach the endpoint
// the test computes from the table; random picks among three endpoints
// would match all of them with a chance of 3^-24.
func TestTCMaglev(t *testing.T) {
	forTCAndXDP(t, func(t *testing.T, f model.IPFamily, mode NorthSouth) {
		if mode == NorthSouthXDP {
			testTCMaglev(t, newXDPFixture(t, f, nil))
		} else {
			testTCMaglev(t, newTCFixture(t, f, false))
		}
	})
}

func testTCMaglev(t *testing.T, x *tcFixture) {
	f := x.f
	eps := x.localEps(8080, x.p11, x.p12, x.p21)
	mag := svc("mag", model.UDP, vip(f, 10), 80).WithTargets(eps, eps, true)
	mag.Port.NodePort = 30080
	mag.Port.Scheduler = "maglev"
	random := svc("random", model.UDP, vip(f, 11), 80).WithTargets(eps, eps, true)
	random.Port.NodePort = 30081
	x.sync([]testSvc{mag, random})
	tb := x.b.nft.(*tcBackend)
	g := tb.groups[groupName{mag.Port.Name, roleExternal}]
	if g == nil || len(g.eps) != 3 {
		t.Fatalf("external group of %s: %+v, want 3 endpoints", mag.Port.Name, g)
	}
	if rg := tb.groups[groupName{random.Port.Name, roleExternal}]; rg == nil || len(tb.st.tables) != 2 || tb.st.tables[rg.id].eps != nil {
		t.Fatalf("tables %v: want the two groups of %s alone", tb.st.tables, mag.Port.Name)
	}
	table := maglevTable(g.eps, tb.rows.m, nil)
	pods := map[netip.Addr]string{}
	for _, p := range []*testnet.Pod{x.p11, x.p12, x.p21} {
		pods[p.IP(f)] = p.Name
	}
	fe := ap(x.tn.Node1.ExternalIP(f), 30080)
	seen := map[string]int{}
	for range 24 {
		s, err := x.client.UDPSocket(fe)
		if err != nil {
			t.Fatal(err)
		}
		r := s.Query(2 * time.Second)
		src := s.LocalAddr()
		s.Close()
		want := g.eps[table[tupleHash(src, fe, 17)%uint64(len(table))]]
		if r.Outcome != testnet.Answered || r.Server != pods[want.Addr()] {
			t.Fatalf("client %s -> %s: %v, want an answer from %s (%s, the Maglev table's pick)", src, fe, r, pods[want.Addr()], want)
		}
		seen[r.Server]++
	}
	t.Logf("24 flows: %v", seen)
	fs, err := x.b.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range fs {
		if fe.Port == 30080 && !strings.Contains(fe.Detail, "maglev") {
			t.Errorf("Inspect: %s:%d %q, want maglev", fe.Addr, fe.Port, fe.Detail)
		}
	}
}

// tupleHash is bpf/nodeport.h's tuple_hash of a flow from src to dst of
// protocol proto: the program reads the 16-byte addresses (IPv4-mapped)
// and the ports as they are on the wire, as little-endian words.
func tupleHash(src, dst netip.AddrPort, proto uint8) uint64 {
	w := func(a netip.Addr, i int) uint64 {
		b := a.As16() // IPv4-mapped for IPv4
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	port := func(p uint16) uint64 {
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], p)
		return uint64(binary.LittleEndian.Uint16(b[:]))
	}
	s, d := src.Addr(), dst.Addr()
	h := mix64((w(s, 0)<<32 | w(s, 1)) ^ 0x70726f78796b6974)
	h = mix64(h ^ (w(s, 2)<<32 | w(s, 3)))
	h = mix64(h ^ (w(d, 0)<<32 | w(d, 1)))
	h = mix64(h ^ (w(d, 2)<<32 | w(d, 3)))
	return mix64(h ^ (port(src.Port())<<32 | port(dst.Port())<<16 | uint64(proto)))
}
