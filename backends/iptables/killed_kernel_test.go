package iptables

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/proxykit/proxykit/model"
)

// errKilled stands for a process killed in the middle of a restore run.
var errKilled = errors.New("killed")

// TestKernelKilledRewrite: a process killed between two commits of a
// complete rewrite (here: its restore input cut after the k-th COMMIT,
// for every k) leaves no fingerprint rule that describes chains other
// than those the kernel holds. The next process, whether it wants the
// state the rewrite was writing or the one before, rewrites what it
// must: the kernel ends up holding what a clean rewrite writes. Without
// the flush in the first commit and the fingerprint in the last one, a
// process killed after the nat commit of the last run left the new
// fingerprint over the old filter rules, and one killed after the nft
// flavour's first runs the old fingerprint over chains partly rewritten:
// both were adopted as they were. The states differ in rules, not in
// chains (a service gains session affinity, one without endpoints
// appears), which adoption does not otherwise see.
func TestKernelKilledRewrite(t *testing.T) {
	for _, mode := range []Mode{ModeNFT, ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			save := "iptables-" + string(mode) + "-save"
			e := newKernelEnv(t, "iptables-"+string(mode)+"-restore", save)
			p11, p21 := e.pod(1, 1), e.pod(2, 1)
			web := e.svc(model.IPv4, "web", "10.96.7.1", p11)
			other := e.svc(model.IPv4, "other", "10.96.7.2", p21)
			sticky := web.With(func(sp *model.ServicePort) { sp.SessionAffinity = true })
			empty := e.svc(model.IPv4, "empty", "10.96.7.3")
			states := []struct {
				name string
				svcs []testSvc
				ref  string // what a clean rewrite leaves
			}{
				{name: "old", svcs: []testSvc{web, other}},
				{name: "new", svcs: []testSvc{sticky, other, empty}},
			}
			newBackend := func() *backend {
				b := e.backend(model.IPv4, Config{Mode: mode})
				if mode == ModeNFT {
					// Sections of one service port, two per run: the
					// rewrite takes several runs.
					b.chunkSize, b.runSections = 2, 2
				}
				return b
			}
			kernel := func() string {
				return rules(e.exec(save, "-t", "nat") + e.exec(save, "-t", "filter"))
			}
			// program leaves the kernel as a clean rewrite of svcs does.
			program := func(svcs []testSvc) string {
				t.Helper()
				b := newBackend()
				if err := b.Cleanup(t.Context()); err != nil {
					t.Fatal(err)
				}
				mustSync(t, b, request(model.IPv4, svcs, nil))
				if b.last.adopted {
					t.Fatal("adopted after a clean-up")
				}
				b.Close()
				return kernel()
			}
			for i := range states {
				states[i].ref = program(states[i].svcs)
			}
			if states[0].ref == states[1].ref {
				t.Fatal("both states hold the same rules")
			}
			old, next := states[0], states[1]
			for k := 1; ; k++ {
				for _, s := range states {
					program(old.svcs)
					// A rewrite to next, killed after its k-th commit.
					b := newBackend()
					commits, killed := 0, false
					b.restoreHook = func(ctx context.Context, data []byte) error {
						for end := 0; ; {
							i := bytes.Index(data[end:], []byte("COMMIT\n"))
							if i < 0 {
								break
							}
							end += i + len("COMMIT\n")
							if commits++; commits == k {
								killed = true
								if err := b.run.Restore(ctx, data[:end]); err != nil {
									return err
								}
								return errKilled
							}
						}
						return b.run.Restore(ctx, data)
					}
					err := b.Sync(t.Context(), request(model.IPv4, next.svcs, nil))
					b.Close()
					if !killed {
						if err != nil {
							t.Fatal(err)
						}
						if k < 3 {
							t.Fatalf("a rewrite of %d commits", commits)
						}
						t.Logf("%d commits", commits)
						return
					}
					if !errors.Is(err, errKilled) {
						t.Fatalf("killed after commit %d: %v", k, err)
					}
					// The next process.
					c := newBackend()
					mustSync(t, c, request(model.IPv4, s.svcs, nil))
					c.Close()
					if got := kernel(); got != s.ref {
						t.Errorf("killed after commit %d, the next process wanting the %s state (adopted: %v) left:\n%s\nwant:\n%s",
							k, s.name, c.last.adopted, got, s.ref)
					}
				}
			}
		})
	}
}
