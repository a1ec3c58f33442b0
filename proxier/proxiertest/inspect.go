package proxiertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/proxykit/proxykit/proxier"
)

// checkInspected checks, when the proxier can read back what it
// programmed, that the kernel holds every frontend of the desired state as
// it should ([proxier.Frontend.Diff]) and none that nothing asks for.
// Service ports the backend reported it could not program are left out.
// A backend without [proxier.Inspector] is not checked. Inspect waits
// for a running sync, and gets timeout besides.
func (e *env) checkInspected(in *instance, timeout time.Duration) {
	e.t.Helper()
	p, ok := in.p.(proxier.Reporter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := p.Inspect(ctx)
	if errors.Is(err, proxier.ErrClosed) {
		return
	}
	if err != nil {
		e.t.Fatalf("Inspect: %v", err)
	}
	var bad []string
	for _, fr := range r.Families {
		if fr.Error == proxier.ErrNoInspector.Error() {
			continue
		}
		if fr.Error != "" {
			bad = append(bad, fr.Family+": "+fr.Error)
			continue
		}
		for _, sr := range fr.Services {
			if sr.Error != "" {
				continue
			}
			for _, f := range sr.Frontends {
				if f.Diff != "" && e.opts.NodeOnly && nodeOnlyAgrees(f) {
					continue
				}
				if f.Diff != "" {
					bad = append(bad, fmt.Sprintf("%s %s %s %s: %s (read: %+v)", fr.Family, sr.Service, f.Kind, f.Want.Frontend, f.Diff, f.Got))
				}
			}
		}
		for _, u := range fr.Unclaimed {
			bad = append(bad, fr.Family+" unclaimed frontend in the kernel: "+u.Frontend+" ("+u.Detail+")")
		}
	}
	if len(bad) > 0 {
		e.t.Errorf("what %s reads back from the kernel differs from the desired state:\n\t%s", r.Backend, strings.Join(bad, "\n\t"))
	}
}

// nodeOnlyAgrees reports whether every frontend read for f agrees with
// its Want as the node and its pods see it: with a NodeOnly backend they
// are every source, so the endpoints only some sources reach are theirs,
// and a verdict for the others does not apply.
func nodeOnlyAgrees(f proxier.FrontendReport) bool {
	if len(f.Got) == 0 {
		return false
	}
	w := f.Want
	eps := append(append([]string{}, w.Endpoints...), w.SomeSources...)
	verdict := w.Verdict
	if len(eps) > 0 {
		verdict = ""
	}
	for _, g := range f.Got {
		if len(g.SomeSources) > 0 || g.Verdict != verdict || g.Affinity != w.Affinity || !sameStrings(g.Endpoints, eps) || !sameStrings(g.SourceRanges, w.SourceRanges) {
			return false
		}
	}
	return true
}

func sameStrings(a, b []string) bool {
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	n := map[string]bool{}
	for _, x := range b {
		if !m[x] {
			return false
		}
		n[x] = true
	}
	return len(m) == len(n)
}
