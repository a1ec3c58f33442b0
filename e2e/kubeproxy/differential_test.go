package kubeproxy_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/kubeproxy"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// group is a set of scenarios that share five sandboxes (one per side):
// each scenario is its own single-stack Service with its own cluster IP,
// external IP, load-balancer IP and node port, so the scenarios of a group
// do not touch each other's rules or traffic.
type group struct {
	name      string
	scenarios []*scenario
	defaults  bool
}

// probeCase is one compared probe: what a difference entry matches.
type probeCase struct {
	backend string
	sc      *scenario
	phase   int // 0 or 1
	st      state
	probe   probe
	kp, pk  string // the summaries of both sides
}

func (c *probeCase) String() string {
	return fmt.Sprintf("%s %s phase %d [%s] %s: kube-proxy %q, proxykit %q", c.backend, c.sc.name, c.phase+1, c.st, c.probe, c.kp, c.pk)
}

// envRun, when set, is a regular expression: only the scenarios whose
// name or description match run (for debugging).
const envRun = "PROXYKIT_KPDIFF_RUN"

// tally collects the results of all groups.
type tally struct {
	mu        sync.Mutex
	scenarios int
	probes    int                            // compared probes, per backend summed
	diffs     map[string]int                 // listed differences seen, per backend
	unlisted  map[string]int                 // per backend
	flakes    map[string]int                 // per backend: differences gone when probed afresh
	done      int                            // groups that ran to the end
	hits      map[*difference]map[string]int // entry -> backend -> differing probes matched
}

// TestKubeProxyDifferential compares proxykit's nftables and iptables
// (nft and legacy flavours) backends with kube-proxy's own nftables and
// iptables proxiers probe by probe over a generated scenario matrix; see
// the package documentation. Every difference must be listed in
// differences, and every listed difference must still occur.
func TestKubeProxyDifferential(t *testing.T) {
	testnet.RequireRoot(t)
	for _, c := range []string{"ip", "nft", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore",
		"iptables-legacy", "ip6tables-legacy", "iptables-legacy-restore", "ip6tables-legacy-restore", "conntrack"} {
		testnet.RequireCommand(t, c)
	}
	kubeproxy.RequireBinary(t)
	checkDifferencesTable(t)

	start := time.Now()
	main := generate()
	defs := generateDefaults(len(main))
	filtered := testing.Short()
	if re := os.Getenv(envRun); re != "" {
		m := regexp.MustCompile(re)
		keep := func(in []*scenario) []*scenario {
			var out []*scenario
			for _, sc := range in {
				if m.MatchString(sc.name) || m.MatchString(sc.String()) {
					out = append(out, sc)
				}
			}
			return out
		}
		main, defs, filtered = keep(main), keep(defs), true
	}
	if testing.Short() {
		// A sample: every 9th scenario. The check that every listed
		// difference still occurs is skipped.
		var sample []*scenario
		for i, sc := range main {
			if i%9 == 0 {
				sample = append(sample, sc)
			}
		}
		main = sample
	}
	var v4, v6 []*scenario
	for _, sc := range main {
		if sc.fam == model.IPv4 {
			v4 = append(v4, sc)
		} else {
			v6 = append(v6, sc)
		}
	}
	var groups []group
	for _, g := range []group{
		{name: "ipv4", scenarios: v4},
		{name: "ipv6", scenarios: v6},
		{name: "nodeport-defaults", scenarios: defs, defaults: true},
	} {
		if len(g.scenarios) > 0 {
			groups = append(groups, g)
		}
	}
	tl := &tally{diffs: map[string]int{}, unlisted: map[string]int{}, flakes: map[string]int{}, hits: map[*difference]map[string]int{}}
	t.Run("groups", func(t *testing.T) {
		for _, g := range groups {
			t.Run(g.name, func(t *testing.T) {
				t.Parallel()
				runGroup(t, g, tl)
			})
		}
	})
	if t.Failed() && tl.probes == 0 {
		return
	}

	// Every listed difference must still occur, for each backend it
	// names.
	for i := range differences {
		if filtered {
			t.Log("-short or " + envRun + ": not checking that every listed difference still occurs")
			break
		}
		if tl.done < len(groups) {
			t.Log("a group did not run to the end: not checking that every listed difference still occurs")
			break
		}
		d := &differences[i]
		for _, b := range d.backends {
			if tl.hits[d][b] == 0 {
				t.Errorf("listed difference %q no longer occurs for %s (kube-proxy: %s; proxykit: %s): remove it from the table or fix the predicate", d.id, b, d.kubeProxy, d.proxykit)
			}
		}
	}
	for i := range differences {
		d := &differences[i]
		var n []string
		for _, b := range d.backends {
			n = append(n, fmt.Sprintf("%s %d", b, tl.hits[d][b]))
		}
		t.Logf("listed difference %q (%s): %s", d.id, strings.SplitN(d.status, ":", 2)[0], strings.Join(n, ", "))
	}
	var per []string
	for _, b := range allBackends {
		per = append(per, fmt.Sprintf("%s %d listed/%d unlisted/%d flaky", b, tl.diffs[b], tl.unlisted[b], tl.flakes[b]))
	}
	t.Logf("SUMMARY: %d scenarios (2 phases each), %d probe comparisons, differences (probe comparisons) per backend: %s; %v",
		tl.scenarios, tl.probes, strings.Join(per, ", "), time.Since(start).Round(time.Second))
}

// runGroup builds the group's five sandboxes, programs both phases and
// compares every probe.
func runGroup(t *testing.T, g group, tl *tally) {
	// Build the topologies in parallel; the oracles and proxiers start on
	// the test goroutine (they register cleanups and may fail the test).
	tns := make([]*testnet.Topology, len(allSides))
	errs := make([]error, len(allSides))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range allSides {
		wg.Go(func() {
			tn, err := testnet.Build(testnet.Options{Node1Pods: 2, Node2Pods: 1})
			mu.Lock()
			tns[i], errs[i] = tn, err
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, tn := range tns {
		if tn != nil {
			t.Cleanup(func() {
				if err := tn.Close(); err != nil {
					t.Errorf("testnet teardown %s: %v", allSides[i], err)
				}
			})
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", allSides[i], err)
		}
	}
	for _, tn := range tns {
		for _, ns := range []*testnet.NS{tn.Node1.NS, tn.Uplink.NS} {
			for _, kv := range icmpSysctls {
				if err := ns.SetSysctl(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	dir := t.TempDir()
	sbs := map[string]*sandbox{}
	for i, side := range allSides {
		switch side {
		case sideKPNFT:
			sbs[side] = newOracleSandbox(t, side, tns[i], kubeproxy.NFTables, g.defaults, dir)
		case sideKPIPT:
			sbs[side] = newOracleSandbox(t, side, tns[i], kubeproxy.IPTables, g.defaults, dir)
		default:
			sbs[side] = newProxykitSandbox(t, side, tns[i], g.defaults)
		}
	}
	for i, tn := range tns {
		t.Logf("%s: topology pk-%s", allSides[i], tn.ID)
	}
	ref := tns[0] // every topology has the same addresses

	tl.mu.Lock()
	tl.scenarios += len(g.scenarios)
	tl.mu.Unlock()

	for phase := range 2 {
		var svcs []*v1.Service
		var sls []*discoveryv1.EndpointSlice
		for _, sc := range g.scenarios {
			s, e := sc.objects(phase, ref)
			svcs = append(svcs, s)
			sls = append(sls, e)
		}
		if phase > 0 {
			// Phase 2 compares how new flows are handled: the flows of
			// phase 1 go, on both sides alike (whether a proxier clears
			// stale flows is the conformance suite's business, and here
			// would depend on which source ports the kernel reuses).
			for i, tn := range tns {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if out, err := tn.Node1.Exec(ctx, "conntrack", "-F"); err != nil {
						t.Errorf("%s: conntrack -F: %v: %s", allSides[i], err, out)
					}
				})
			}
			wg.Wait()
		}
		applyStart := time.Now()
		aerrs := make([]error, len(allSides))
		for i, side := range allSides {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
				defer cancel()
				aerrs[i] = sbs[side].apply(ctx, phase, svcs, sls)
			})
		}
		wg.Wait()
		for i, err := range aerrs {
			if err != nil {
				t.Fatalf("phase %d: apply %s: %v", phase+1, allSides[i], err)
			}
		}
		t.Logf("phase %d: %d services programmed on %d sandboxes in %v", phase+1, len(svcs), len(allSides), time.Since(applyStart).Round(time.Millisecond))

		probeStart := time.Now()
		type key struct {
			side string
			sc   int
			p    int
		}
		results := map[key]*obs{}
		probes := map[int][]probe{}
		for _, sc := range g.scenarios {
			probes[sc.idx] = probesFor(sc, ref)
			for pi := range probes[sc.idx] {
				for _, side := range allSides {
					results[key{side, sc.idx, pi}] = newObs()
				}
			}
		}
		for _, sc := range g.scenarios {
			for _, side := range allSides {
				tn := sbs[side].tn
				if sc.phases[phase].affinity {
					// The affinity of a client is per Service, shared by
					// its destinations, some of which may use other
					// endpoints (policy Local): probe them one after the
					// other, in a fixed order, per client.
					for _, c := range clients {
						wg.Go(func() {
							for pi, p := range probes[sc.idx] {
								if p.client == c {
									results[key{side, sc.idx, pi}].run(tn, p, sc.fam)
								}
							}
						})
					}
					continue
				}
				for pi, p := range probes[sc.idx] {
					o := results[key{side, sc.idx, pi}]
					wg.Go(func() { o.run(tn, p, sc.fam) })
				}
			}
		}
		wg.Wait()

		// Compare; re-probe both sides of a pair whose answering sets
		// differ, to rule out chance.
		var all []cmp
		var retry, confirm []cmp
		for _, b := range allBackends {
			for _, sc := range g.scenarios {
				aff := sc.phases[phase].affinity
				for pi := range probes[sc.idx] {
					c := cmp{b, sc, pi}
					all = append(all, c)
					kp, pk := results[key{pairs[b][0], sc.idx, pi}], results[key{pairs[b][1], sc.idx, pi}]
					listed := len(matchDifferences(&probeCase{backend: b, sc: sc, phase: phase, st: sc.phases[phase], probe: probes[sc.idx][pi]})) > 0
					switch {
					case kp.summary(aff) == pk.summary(aff):
						// A listed difference in the answering sets may
						// hide behind a pod missed by chance.
						if listed && !aff && kp.answered() {
							retry = append(retry, c)
						}
					case kp.mixed() || pk.mixed():
						confirm = append(confirm, c)
					case !aff && kp.answered() && pk.answered():
						retry = append(retry, c)
					}
				}
			}
		}
		// Differing answering sets, or equal ones where a difference is
		// listed: more tries on both sides, added to the first ones (a
		// pod missed by chance shows up). A kube-proxy side serves two
		// pairs (iptables-nft and iptables-legacy): its added tries
		// change the other pair's comparison too, so that pair is
		// re-probed as well (each side once), lest it compare 8 tries of
		// its proxykit side, which agreed with kube-proxy's first 8, to
		// 32 of kube-proxy's.
		retry = sharingKubeProxySide(retry)
		reprobed := map[key]bool{}
		for _, c := range retry {
			p := probes[c.sc.idx][c.pi]
			for _, side := range pairs[c.backend] {
				k := key{side, c.sc.idx, c.pi}
				if reprobed[k] {
					continue
				}
				reprobed[k] = true
				o := results[k]
				tn := sbs[side].tn
				wg.Go(func() { o.seq(tn, p, c.sc.fam, extraTries) })
			}
		}
		wg.Wait()
		for _, c := range retry {
			kp, pk := results[key{pairs[c.backend][0], c.sc.idx, c.pi}], results[key{pairs[c.backend][1], c.sc.idx, c.pi}]
			if kp.summary(false) != pk.summary(false) && (kp.mixed() || pk.mixed()) {
				confirm = append(confirm, c)
			}
		}
		// A side whose tries ended in more than one outcome class: probe
		// both sides afresh, one try after the other; the fresh results
		// are compared, and a difference that went away is logged and
		// counted as a flake, not hidden.
		fresh := map[cmp][2]*obs{}
		for _, c := range confirm {
			p := probes[c.sc.idx][c.pi]
			pair := [2]*obs{newObs(), newObs()}
			fresh[c] = pair
			for i, side := range pairs[c.backend] {
				tn := sbs[side].tn
				wg.Go(func() {
					if c.sc.phases[phase].affinity {
						pair[i].run(tn, p, c.sc.fam)
					} else {
						pair[i].seq(tn, p, c.sc.fam, confirmTries)
					}
				})
			}
		}
		wg.Wait()
		for _, c := range confirm {
			pair := fresh[c]
			if !c.sc.phases[phase].affinity && pair[0].answered() && pair[1].answered() && pair[0].summary(false) != pair[1].summary(false) {
				p := probes[c.sc.idx][c.pi]
				for i, side := range pairs[c.backend] {
					tn := sbs[side].tn
					wg.Go(func() { pair[i].seq(tn, p, c.sc.fam, extraTries) })
				}
			}
		}
		wg.Wait()
		t.Logf("phase %d: %d probes × %d sandboxes in %v (%d re-probed, %d confirmed afresh)", phase+1, len(results)/len(allSides), len(allSides), time.Since(probeStart).Round(time.Millisecond), len(retry), len(confirm))

		var lines []string
		var unlisted []cmp
		for _, c := range all {
			aff := c.sc.phases[phase].affinity
			pc := &probeCase{
				backend: c.backend, sc: c.sc, phase: phase, st: c.sc.phases[phase], probe: probes[c.sc.idx][c.pi],
				kp: results[key{pairs[c.backend][0], c.sc.idx, c.pi}].summary(aff),
				pk: results[key{pairs[c.backend][1], c.sc.idx, c.pi}].summary(aff),
			}
			if f, ok := fresh[c]; ok {
				first := fmt.Sprintf("kube-proxy %q, proxykit %q", pc.kp, pc.pk)
				pc.kp, pc.pk = f[0].summary(aff), f[1].summary(aff)
				if pc.kp == pc.pk {
					t.Logf("FLAKE (gone when probed afresh; first tries: %s): %s", first, pc)
					tl.mu.Lock()
					tl.flakes[c.backend]++
					tl.mu.Unlock()
				} else {
					t.Logf("confirmed afresh (first tries: %s): %s", first, pc)
				}
			}
			for _, s := range []string{pc.kp, pc.pk} {
				if strings.Contains(s, "failed") {
					t.Errorf("probe failed (neither answered, rejected nor dropped): %s", pc)
				}
			}
			matched := matchDifferences(pc)
			tl.mu.Lock()
			tl.probes++
			switch {
			case pc.kp == pc.pk && len(matched) > 0:
				t.Errorf("listed difference %q did not occur: %s", matched[0].id, pc)
			case pc.kp != pc.pk && len(matched) == 0:
				tl.unlisted[c.backend]++
				lines = append(lines, "UNLISTED "+pc.String())
				unlisted = append(unlisted, c)
			case pc.kp != pc.pk:
				tl.diffs[c.backend]++
				for _, d := range matched {
					if tl.hits[d] == nil {
						tl.hits[d] = map[string]int{}
					}
					tl.hits[d][c.backend]++
				}
				lines = append(lines, fmt.Sprintf("listed %q: %s", matched[0].id, pc))
			}
			tl.mu.Unlock()
		}
		if phase == 1 {
			tl.mu.Lock()
			tl.done++
			tl.mu.Unlock()
		}
		// An unlisted difference: what each side's tries saw, and what
		// its node1 holds for the service, to tell a dataplane
		// difference from chance.
		for _, c := range unlisted {
			p := probes[c.sc.idx][c.pi]
			for i, side := range pairs[c.backend] {
				o := results[key{side, c.sc.idx, c.pi}]
				if f, ok := fresh[c]; ok {
					o = f[i]
				}
				t.Logf("%s %s %s phase %d: tries:\n%s\n%s", side, c.sc.name, p, phase+1, o.tries(), dataplaneOf(sbs[side], c.sc, p))
			}
		}
		sort.Strings(lines)
		for _, l := range lines {
			if strings.HasPrefix(l, "UNLISTED") {
				t.Errorf("DIFF %s", l)
			} else {
				t.Logf("DIFF %s", l)
			}
		}
	}
}

// matchDifferences returns the entries of the table that match c.
func matchDifferences(c *probeCase) []*difference {
	var out []*difference
	for i := range differences {
		d := &differences[i]
		if slices.Contains(d.backends, c.backend) && d.match(c) {
			out = append(out, d)
		}
	}
	return out
}

// checkDifferencesTable checks the table's own form: unique ids, known
// backends, and a status that says "deliberate" or "to fix".
func checkDifferencesTable(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range differences {
		if seen[d.id] {
			t.Errorf("differences: duplicate id %q", d.id)
		}
		seen[d.id] = true
		if !strings.HasPrefix(d.status, "deliberate") && !strings.HasPrefix(d.status, "to fix") {
			t.Errorf("differences: %q: status %q must start with \"deliberate\" or \"to fix\"", d.id, d.status)
		}
		if len(d.backends) == 0 || d.match == nil || d.kubeProxy == "" || d.proxykit == "" {
			t.Errorf("differences: %q is incomplete", d.id)
		}
		for _, b := range d.backends {
			if !slices.Contains(allBackends, b) {
				t.Errorf("differences: %q: unknown backend %q", d.id, b)
			}
		}
	}
}

// cmp is one comparison: probe pi of scenario sc, between backend's
// kube-proxy side and its proxykit side.
type cmp struct {
	backend string
	sc      *scenario
	pi      int
}

// sharingKubeProxySide returns cs and, for each of its comparisons, the
// comparisons of the same probe by the other backends with the same
// kube-proxy side, each once: tries added to a side change every
// comparison that reads it.
func sharingKubeProxySide(cs []cmp) []cmp {
	seen := map[cmp]bool{}
	var out []cmp
	for _, c := range cs {
		for _, b := range allBackends {
			if pairs[b][0] != pairs[c.backend][0] {
				continue
			}
			if o := (cmp{b, c.sc, c.pi}); !seen[o] {
				seen[o] = true
				out = append(out, o)
			}
		}
	}
	return out
}
