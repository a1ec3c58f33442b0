package proxiertest

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Factory builds the proxier under test for cfg. It is called once per
// case and family (twice in the restart and cleanup cases), from the
// test's goroutine;
// it fails the test (t.Fatal) if the proxier cannot be built. The suite
// owns the returned Proxier: it delivers the objects, runs it, and calls
// Cleanup and Close at the end of the case.
type Factory func(t testing.TB, cfg proxier.Config) proxier.Proxier

// Options tune a run of the suite. The zero value runs every case for
// IPv4 and IPv6, in parallel.
type Options struct {
	// Skip names the cases a backend cannot pass yet, each with the
	// reason, reported through t.Skip. A key is a case name from
	// [Cases] (all its families) or a case name and a family, e.g.
	// "Hairpin/IPv6". A key that names no case fails the run, so a skip
	// does not outlive a renamed case.
	Skip map[string]string
	// Families are the IP families to run; empty means IPv4 and IPv6.
	// The dual-stack case runs only when both are listed.
	Families []model.IPFamily
	// Serial runs the cases one after another instead of in parallel
	// (t.Parallel), for a backend that cannot have two instances in one
	// process.
	Serial bool
	// LogLevel is the least level of the proxier's log records that are
	// written to the test log. The zero value is slog.LevelInfo.
	LogLevel slog.Level
	// RestartProbeInterval is the pause between the new connections each
	// prober of Restart-NewConnectionsSurvive opens. Zero means 500µs,
	// which finds a gap of a few milliseconds; a slow machine (an
	// emulated VM) may set more, up to 20ms (50 connections a second).
	RestartProbeInterval time.Duration
	// NodeOnly says the backend serves only connections that start on
	// the node and in its pods (the eBPF backend's socket-only mode):
	// cases about the node and its pods that also probe from the outside
	// client (the restart cases) leave that probe out. Cases that are
	// only about outside traffic still belong in Skip.
	NodeOnly bool
	// LocalhostNodePorts says the backend serves IPv4 node ports on
	// 127.0.0.1 as kube-proxy's iptables mode does by default
	// (--iptables-localhost-nodeports). Otherwise, as in kube-proxy's
	// nftables mode, 127.0.0.1:<nodePort> is left to the node's own
	// sockets.
	LocalhostNodePorts bool
	// ServiceCIDRs says the backend drops new connections to addresses
	// of the service CIDRs that no service holds, as kube-proxy's
	// nftables mode does. Otherwise, as in kube-proxy's iptables and
	// ipvs modes, they are routed like any other address.
	ServiceCIDRs bool
}

// testCase is one behaviour the suite checks.
type testCase struct {
	name string
	// dual marks the one case run with both families at once.
	dual bool
	// needs are programs the case runs in the node namespace.
	needs []string
	run   func(e *env)
}

// Cases returns the names of all cases, in the order the suite runs them.
// Each runs as the subtests "<name>/IPv4" and "<name>/IPv6", except
// "DualStack", which runs once with both families.
func Cases() []string {
	names := make([]string, len(cases))
	for i, c := range cases {
		names[i] = c.name
	}
	return names
}

// Run runs the conformance suite against the proxiers f builds. Every case
// builds its own network topology (see internal/testnet), starts a fresh
// proxier in its node namespace, feeds it Services, EndpointSlices and the
// Node through its handlers, waits for Flush after every change, and sends
// real TCP, UDP and SCTP traffic to check where it lands and with which
// source address.
//
// Run needs root; without it every case is skipped, unless CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1, which make that a failure.
func Run(t *testing.T, f Factory, opts Options) {
	t.Helper()
	fams := opts.Families
	if len(fams) == 0 {
		fams = []model.IPFamily{model.IPv4, model.IPv6}
	}
	for _, f := range fams {
		if f != model.IPv4 && f != model.IPv6 {
			t.Fatalf("proxiertest: Options.Families holds %v", f)
		}
	}
	for k := range opts.Skip {
		if !validSkipKey(k) {
			t.Errorf("proxiertest: Options.Skip names no case: %q (cases: %s)", k, strings.Join(Cases(), ", "))
		}
	}
	testnet.RequireRoot(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !opts.Serial {
				t.Parallel()
			}
			if c.dual {
				if !slices.Contains(fams, model.IPv4) || !slices.Contains(fams, model.IPv6) {
					t.Skip("needs both IP families")
				}
				runCase(t, c, f, opts, model.IPv4, true)
				return
			}
			for _, fam := range fams {
				t.Run(fam.String(), func(t *testing.T) {
					if !opts.Serial {
						t.Parallel()
					}
					runCase(t, c, f, opts, fam, false)
				})
			}
		})
	}
}

func runCase(t *testing.T, c testCase, f Factory, opts Options, fam model.IPFamily, dual bool) {
	for _, k := range []string{c.name, c.name + "/" + fam.String()} {
		if why, ok := opts.Skip[k]; ok {
			t.Skipf("skipped by the backend: %s", why)
		}
	}
	for _, cmd := range c.needs {
		testnet.RequireCommand(t, cmd)
	}
	e := newEnv(t, f, opts, fam, dual)
	c.run(e)
}

func validSkipKey(k string) bool {
	name, fam, hasFam := strings.Cut(k, "/")
	if hasFam && fam != model.IPv4.String() && fam != model.IPv6.String() {
		return false
	}
	return slices.Contains(Cases(), name)
}
