package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
)

// Past defaultPartSpan service ports, a shard's endpoint maps split into
// parts (see numParts; the tests make the span numShards): they check that an endpoint change in a big
// shard writes one small map, that the shared chains read every part in
// use and follow the parts as they come and go, and, on a real kernel,
// that traffic reaches the service ports of every part.

// partsTestServices is enough service ports for parts 0 to 3 of every
// shard: 3*numShards+8 of 2 endpoints, every tenth with a node port.
func partsTestServices() []testSvc { return backendtest.ScaleServices(3*numShards+8, 2) }

// rangeElems counts the range elements of st in each endpoint map.
func rangeElems(st *state) map[string]int {
	n := map[string]int{}
	for _, s := range st.services {
		for _, r := range s.objs.ranges {
			n[r.set] += 2 * len(s.objs.slots[r.group])
		}
	}
	return n
}

// countOf counts s in msgs.
func countOf(msgs []string, s string) int {
	n := 0
	for _, m := range msgs {
		if m == s {
			n++
		}
	}
	return n
}

// balancedMaps returns the endpoint maps a chain's rules look up, in
// order.
func balancedMaps(c *chainObj) []string {
	var out []string
	for _, ru := range c.rules {
		for _, e := range ru {
			if l, ok := e.(*expr.Lookup); ok && strings.HasPrefix(l.SetName, setEndpointsPrefix) {
				out = append(out, l.SetName)
			}
		}
	}
	return out
}

func TestShardPartsSplitBigShards(t *testing.T) {
	b := offlineBackend(t)
	if r := b.r; r.partOf(defaultPartSpan-1) != 0 || r.partOf(defaultPartSpan) != 1 || r.partOf(numParts*defaultPartSpan) != 0 {
		t.Fatalf("default span: ids %d, %d, %d in parts %d, %d, %d; want 0, 1, 0", defaultPartSpan-1, defaultPartSpan, numParts*defaultPartSpan,
			r.partOf(defaultPartSpan-1), r.partOf(defaultPartSpan), r.partOf(numParts*defaultPartSpan))
	}
	b.r.partSpan = numShards
	svcs := partsTestServices()
	st, errs := b.buildFull(request(model.IPv4, svcs, nil), true, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.st = st
	// Every service port's ranges are in its shard's part, and no map
	// holds more than one service port's (ids 1 to 776: one per shard
	// and part); one map per shard held three or four.
	for n, s := range st.services {
		shard, _ := groupOf(s.id, 0)
		for _, r := range s.objs.ranges {
			if want := endpointsMap(shard, b.r.partOf(s.id)); r.set != want {
				t.Fatalf("%s (id %d): ranges in %s, want %s", n, s.id, r.set, want)
			}
		}
	}
	most := 0
	for _, c := range rangeElems(st) {
		most = max(most, c)
	}
	if most > 2*2*2 { // cluster IP and node port, 2 endpoints each
		t.Errorf("an endpoint map holds %d range elements, want at most 8", most)
	}
	// Shard 5 uses parts 0 to 3 (ids 5, 261, 517, 773): its cluster
	// chain reads all four, in order.
	const shard = 5
	ps := st.objects.parts(shard)
	if ps != 0b1111 {
		t.Fatalf("shard %d uses parts %04b, want 1111", shard, ps)
	}
	o, err := b.r.object(shardRef{kind: objCluster, shard: shard}, ps)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{endpointsMap(shard, 0), endpointsMap(shard, 1), endpointsMap(shard, 2), endpointsMap(shard, 3)}
	if got := balancedMaps(o.chain); !slices.Equal(got, want) {
		t.Fatalf("cluster chain of shard %d reads %v, want %v", shard, got, want)
	}

	byID := map[uint32]int{}
	for i, s := range svcs {
		byID[st.services[s.Port.Name].id] = i
	}
	last := byID[3*numShards+shard] // part 3 of shard 5

	// One endpoint replaced: its ranges in part 3 only, and hairpin
	// (the replaced address was this service port's alone).
	changed := slices.Clone(svcs)
	tg := changed[last].Targets
	eps := slices.Clone(tg.Internal)
	eps[1] = backendtest.Endpoint("10.200.0.1:8080")
	changed[last] = changed[last].WithTargets(eps, eps, true)
	d, tx, errs, err := b.buildIncremental(request(model.IPv4, changed, backendtest.Names(changed[last])), nil)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	name := changed[last].Port.Name.String()
	wantMsgs := []string{
		name + ": delete elements from " + endpointsMap(shard, 3),
		"delete elements from hairpin",
		name + ": add elements to " + endpointsMap(shard, 3),
		"add elements to hairpin",
	}
	if msgs := messages(tx); !slices.Equal(msgs, wantMsgs) {
		t.Errorf("replacing an endpoint:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(wantMsgs, "\n"))
	}
	d.apply()

	// Deleting the last service port of part 3: its map goes, after the
	// shard's cluster chain is rewritten to read parts 0 to 2.
	rest := slices.Delete(slices.Clone(changed), last, last+1)
	d, tx, errs, err = b.buildIncremental(request(model.IPv4, rest, backendtest.Names(changed[last])), nil)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	cluster := sharedChain(chainClusterPrefix, shard)
	msgs := messages(tx)
	flush := slices.Index(msgs, "flush chain "+cluster)
	del := slices.Index(msgs, "delete set "+endpointsMap(shard, 3))
	if flush < 0 || del < flush {
		t.Fatalf("deleting part 3: want the cluster chain flushed, then the map deleted:\n%s", strings.Join(msgs, "\n"))
	}
	if n := countOf(msgs, "add rule to chain "+cluster); n != 3 {
		t.Errorf("deleting part 3: %d rules re-added to %s, want 3:\n%s", n, cluster, strings.Join(msgs, "\n"))
	}
	d.apply()
	if ps := st.objects.parts(shard); ps != 0b0111 {
		t.Fatalf("after deleting part 3: parts %04b, want 0111", ps)
	}

	// Adding it back (it takes the freed id): the map first, then the
	// chain with four rules again.
	d, tx, errs, err = b.buildIncremental(request(model.IPv4, changed, backendtest.Names(changed[last])), nil)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	msgs = messages(tx)
	add := slices.Index(msgs, "add set "+endpointsMap(shard, 3))
	flush = slices.Index(msgs, "flush chain "+cluster)
	if add < 0 || flush < add {
		t.Fatalf("adding part 3 back: want the map added, then the cluster chain flushed:\n%s", strings.Join(msgs, "\n"))
	}
	d.apply()
	if ps := st.objects.parts(shard); ps != 0b1111 {
		t.Fatalf("after adding it back: parts %04b, want 1111", ps)
	}
}

// TestShardPartPrefixesPerShard: range set prefixes are unique within a
// shard, across its parts (the shared chains read them all, first match
// wins), and only within it.
func TestShardPartPrefixesPerShard(t *testing.T) {
	for _, tc := range []struct{ a, b, same string }{
		{endpointsMap(7, 0), endpointsMap(7, 3), "yes"},
		{endpointsMap(7, 2), endpointsMap(7, 15), "yes"},
		{endpointsMap(7, 0), endpointsMap(8, 0), ""},
		{endpointsMap(7, 1), endpointsMap(8, 1), ""},
		{setServiceIPs, setServiceIPs, "yes"},
	} {
		if got := prefixSpace(tc.a) == prefixSpace(tc.b); got != (tc.same != "") {
			t.Errorf("%s and %s share a prefix space: %v", tc.a, tc.b, got)
		}
	}
	if got := endpointsMap(7, 0); got != "endpoints-007" {
		t.Errorf("part 0 of shard 7 is %s, want endpoints-007", got)
	}
}

func TestKernelShardParts(t *testing.T) {
	requireRoot(t)
	topo := newTopology(t)
	b := newTestBackend(t, topo.node, model.IPv4, Config{})
	b.r.partSpan = numShards
	// Endpoints on the test pods, every service port on both.
	svcs := partsTestServices()
	for i, s := range svcs {
		p := *s.Port
		p.ClusterIP = netip.AddrFrom4([4]byte{10, 96, byte(200 + i/200), byte(i%200 + 1)})
		p.Port = 80
		if p.NodePort != 0 {
			p.NodePort = uint16(30000 + i)
		}
		eps := backendtest.Endpoints(pod1v4, pod2v4)
		svcs[i] = testSvc{Port: &p, Targets: s.Targets}.WithTargets(eps, eps, true)
	}
	mustSync(t, b, request(model.IPv4, svcs, nil))
	at := func(id uint32) int {
		for i, s := range svcs {
			if b.st.services[s.Port.Name].id == id {
				return i
			}
		}
		t.Fatalf("no service port with id %d", id)
		return 0
	}
	const shard = 5
	ids := []uint32{shard, numShards + shard, 2*numShards + shard, 3*numShards + shard}
	reach := func(i int, want ...string) {
		t.Helper()
		addr := netip.AddrPortFrom(svcs[i].Port.ClusterIP, 80)
		n := countPods(t, topo.node, addr, 20)
		for p := range n {
			if !slices.Contains(want, p) {
				t.Fatalf("%s (%s): %v, want only %v", svcs[i].Port.Name, addr, n, want)
			}
		}
	}
	for _, id := range ids {
		reach(at(id), "pod1", "pod2")
	}
	// A node port in part 1 (every tenth service port has one).
	np := -1
	for i, s := range svcs {
		if id := b.st.services[s.Port.Name].id; s.Port.NodePort != 0 && b.r.partOf(id) == 1 {
			np = i
			break
		}
	}
	if np < 0 {
		t.Fatal("no node port in part 1")
	}
	if a, err := askTCP(topo.client, netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), svcs[np].Port.NodePort), longWait); err != nil || (a.pod != "pod1" && a.pod != "pod2") {
		t.Fatalf("node port %d: %v %v", svcs[np].Port.NodePort, a, err)
	}
	// Read back: the shard's cluster chain reads its four maps, each
	// holds one service port's ranges, and the inspector follows the
	// rules to both endpoints.
	tbl, err := ReadTable(t.Context(), topo.node.path, model.IPv4, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tbl.Sets {
		if strings.HasPrefix(s.Name, setEndpointsPrefix) && len(s.Elements) > 4 {
			t.Errorf("%s holds %d ranges, want at most 4 (one service port)", s.Name, len(s.Elements))
		}
	}
	for _, c := range tbl.Chains {
		if c.Name != sharedChain(chainClusterPrefix, shard) {
			continue
		}
		var read []string
		for _, r := range c.Rules {
			for p := range uint32(numParts) {
				if strings.Contains(r, "set "+endpointsMap(shard, p)+" ") {
					read = append(read, endpointsMap(shard, p))
				}
			}
		}
		if want := []string{endpointsMap(shard, 0), endpointsMap(shard, 1), endpointsMap(shard, 2), endpointsMap(shard, 3)}; !slices.Equal(read, want) {
			t.Errorf("%s reads %v, want %v", c.Name, read, want)
		}
	}
	lastIP := svcs[at(ids[3])].Port.ClusterIP.String()
	found := false
	for _, r := range tbl.Routes {
		if strings.HasPrefix(r.Key, lastIP+" ") {
			found = true
			if len(r.Endpoints) != 2 {
				t.Errorf("route %s: endpoints %v, want 2", r.Key, r.Endpoints)
			}
		}
	}
	if !found {
		t.Errorf("no route for %s", lastIP)
	}

	// An endpoint change in part 3 writes that part only; traffic
	// follows.
	last := at(ids[3])
	one := backendtest.Endpoints(pod1v4)
	svcs[last] = svcs[last].WithTargets(one, one, true)
	mustSync(t, b, request(model.IPv4, svcs, backendtest.Names(svcs[last])))
	reach(last, "pod1")
	// Part 3 goes with its last service port; the others still work.
	gone := svcs[last]
	rest := slices.Delete(slices.Clone(svcs), last, last+1)
	mustSync(t, b, request(model.IPv4, rest, backendtest.Names(gone)))
	if out, err := topo.node.nft("list", "set", "ip", "proxykit", endpointsMap(shard, 3)); err == nil {
		t.Fatalf("%s outlived its last service port:\n%s", endpointsMap(shard, 3), out)
	}
	for _, id := range ids[:3] {
		reach(at(id), "pod1", "pod2")
	}
	// It comes back.
	mustSync(t, b, request(model.IPv4, svcs, backendtest.Names(gone)))
	reach(at(ids[3]), "pod1")
	cleanupAndCheck(t, b, topo.node)
}
