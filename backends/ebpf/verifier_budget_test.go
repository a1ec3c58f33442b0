package ebpf

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/testnet"
)

// verifierBudget is the most instructions the verifier may process for
// one north-south program (a tenth of its limit of 1,000,000; the
// largest, pk_tc_pod, takes 83,069 on 6.18), so that a change that
// multiplies the paths it walks fails here, not at a user's New, and
// every New stays cheap (a conformance case verifies the programs each
// time, which under the VM's emulation took 4.6 s before still_in
// became a global function). Inlining still_in again (175,573 for
// pk_tc_ext) or walking serve after each of decap's exits (946,982)
// fails it.
const verifierBudget = 100_000

// TestProgramsVerifierBudget loads the tc and XDP objects with verifier
// statistics and requires each program within verifierBudget.
func TestProgramsVerifierBudget(t *testing.T) {
	testnet.RequireRoot(t)
	processed := regexp.MustCompile(`processed (\d+) insns`)
	took := regexp.MustCompile(`verification time (\d+) usec`)
	for _, obj := range []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
	}{{"nodeport", loadNodeport}, {"xdp", loadXdp}} {
		spec, err := obj.load()
		if err != nil {
			t.Fatal(err)
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
		if err != nil {
			t.Fatalf("%s: %v", obj.name, err)
		}
		for name, p := range coll.Programs {
			m := processed.FindStringSubmatch(p.VerifierLog)
			if m == nil {
				t.Errorf("%s %s: no statistics in the verifier's log", obj.name, name)
				continue
			}
			n, _ := strconv.Atoi(m[1])
			us := "?"
			if m := took.FindStringSubmatch(p.VerifierLog); m != nil {
				us = m[1]
			}
			t.Logf("%s %s: %d instructions processed in %s µs (kernel %s)", obj.name, name, n, us, kernelRelease())
			if n > verifierBudget {
				t.Errorf("%s %s: the verifier processed %d instructions, over the budget of %d (its limit is 1,000,000)", obj.name, name, n, verifierBudget)
			}
		}
		coll.Close()
	}
}
