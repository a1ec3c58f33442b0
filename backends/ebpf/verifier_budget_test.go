package ebpf

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/testnet"
)

// verifierBudget is the most instructions the verifier may process for
// one north-south program (under a third of its limit of 1,000,000; the
// largest, pk_tc_ext, takes 175,573 on 6.18), so that a change
// that multiplies the paths it walks (pk_tc_ext walked serve after each
// of decap's exits: 946,982) fails here, not at a user's New, and every
// New stays cheap (a conformance case verifies the programs each time).
const verifierBudget = 300_000

// TestProgramsVerifierBudget loads the tc and XDP objects with verifier
// statistics and requires each program within verifierBudget.
func TestProgramsVerifierBudget(t *testing.T) {
	testnet.RequireRoot(t)
	processed := regexp.MustCompile(`processed (\d+) insns`)
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
			t.Logf("%s %s: %d instructions processed (kernel %s)", obj.name, name, n, kernelRelease())
			if n > verifierBudget {
				t.Errorf("%s %s: the verifier processed %d instructions, over the budget of %d (its limit is 1,000,000)", obj.name, name, n, verifierBudget)
			}
		}
		coll.Close()
	}
}
