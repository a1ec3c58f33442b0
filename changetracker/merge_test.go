package changetracker

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
)

// TestMergedMatchesRebuild checks the merged candidates of big Services
// (mergeChanged): over random sequences of slice changes (duplicate
// addresses within and across slices, every rank, slices moving between
// Services, deletions, cluster IP changes onto an endpoint), the state
// after every Apply equals that of a fresh tracker fed the same objects in
// a random order. mergeMin is lowered so that small Services keep merged
// lists, and raised to one the Services cross both ways.
func TestMergedMatchesRebuild(t *testing.T) {
	saved := mergeMin
	defer func() { mergeMin = saved }()
	for _, min := range []int{1, 40} {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("mergeMin=%d/seed=%d", min, seed), func(t *testing.T) {
				mergeMin = min
				mergedRebuildOnce(t, rand.New(rand.NewPCG(seed, 56)))
			})
		}
	}
}

func mergedRebuildOnce(t *testing.T, rng *rand.Rand) {
	svcNames := []string{"a", "b"}
	sliceNames := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	allPorts := []discoveryv1.EndpointPort{
		eport("", v1.ProtocolTCP, 8080), eport("p", v1.ProtocolUDP, 53), eport("q", v1.ProtocolTCP, 9090),
	}
	conds := []*bool{nil, tru, fls}
	genSvc := func(name string) *v1.Service {
		// Two of the cluster IPs are endpoint addresses.
		return svc(name, clusterIPs([]string{"10.0.0.1", "10.1.0.1", "10.1.0.2"}[rng.IntN(3)]),
			ports(v1.ServicePort{Port: 80, Protocol: v1.ProtocolTCP}))
	}
	genSlice := func(name string) *discoveryv1.EndpointSlice {
		var ps []discoveryv1.EndpointPort
		for _, p := range allPorts {
			if rng.IntN(2) == 0 {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 {
			ps = allPorts[:1]
		}
		var eps []discoveryv1.Endpoint
		for range rng.IntN(30) {
			e := ep(fmt.Sprintf("10.1.0.%d", 1+rng.IntN(24)),
				conds[rng.IntN(3)], conds[rng.IntN(3)], conds[rng.IntN(3)])
			e.NodeName = ptr([]string{"node1", "node2"}[rng.IntN(2)])
			if rng.IntN(2) == 0 {
				e.Zone = ptr("z1")
			}
			eps = append(eps, e)
		}
		return slice(name, svcNames[rng.IntN(len(svcNames))], ps, eps...)
	}

	tr := New(Config{Family: model.IPv4, NodeName: "node1"})
	svcs := map[string]*v1.Service{}
	sls := map[string]*discoveryv1.EndpointSlice{}
	mergedApplies := 0
	for round := range 60 {
		for range 1 + rng.IntN(3) {
			switch r := rng.IntN(10); {
			case r < 6: // add or update a slice, perhaps moving it
				name := sliceNames[rng.IntN(len(sliceNames))]
				s := genSlice(name)
				tr.OnEndpointSlice(s, false)
				sls[name] = s
			case r < 8: // delete a slice
				name := sliceNames[rng.IntN(len(sliceNames))]
				if old := sls[name]; old != nil {
					tr.OnEndpointSlice(old, true)
					delete(sls, name)
				}
			case r < 9: // add or update a service
				name := svcNames[rng.IntN(len(svcNames))]
				s := genSvc(name)
				tr.OnService(svcs[name], s)
				svcs[name] = s
			default: // delete a service
				name := svcNames[rng.IntN(len(svcNames))]
				if old := svcs[name]; old != nil {
					tr.OnService(old, nil)
					delete(svcs, name)
				}
			}
		}
		tr.Apply()
		for _, e := range tr.svcs {
			if e.merged != nil {
				mergedApplies++
			}
		}

		fresh := New(Config{Family: model.IPv4, NodeName: "node1"})
		svcKeys, sliceKeys := slices.Collect(maps.Keys(svcs)), slices.Collect(maps.Keys(sls))
		rng.Shuffle(len(svcKeys), func(i, j int) { svcKeys[i], svcKeys[j] = svcKeys[j], svcKeys[i] })
		rng.Shuffle(len(sliceKeys), func(i, j int) { sliceKeys[i], sliceKeys[j] = sliceKeys[j], sliceKeys[i] })
		for _, k := range sliceKeys {
			fresh.OnEndpointSlice(sls[k], false)
		}
		for _, k := range svcKeys {
			fresh.OnService(nil, svcs[k])
		}
		fresh.Apply()
		if diff := cmp.Diff(fresh.State(), tr.State(), cmpOpts); diff != "" {
			t.Fatalf("round %d: incremental state differs from a rebuild (-rebuild +incremental):\n%s", round, diff)
		}
	}
	if mergedApplies == 0 {
		t.Fatal("no Service kept merged candidates: the test does not test them")
	}
}
