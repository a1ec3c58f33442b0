package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
	"github.com/proxykit/proxykit/sandbox"
)

// TestController runs the controller with the bundled services and two
// selectors. It checks with traffic in its sandbox that the selected
// Services answer from their pods and the others do not, and fails if
// not.
func TestController(t *testing.T) {
	sandbox.RequirePrivilege(t)
	for _, tc := range []struct {
		selector string
		selected []string
	}{
		{"", []string{"demo/shop", "demo/api"}},
		{"tier=backend", []string{"demo/api", "demo/database"}},
	} {
		t.Run(tc.selector, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, options{selector: tc.selector}, &out)
			t.Logf("output:\n%s", out.String())
			if err != nil {
				t.Fatal(err)
			}
			for _, svc := range []string{"demo/shop", "demo/api", "demo/database"} {
				want := "not selected  → timed out"
				if slices.Contains(tc.selected, svc) {
					want = "selected      → node"
				}
				line := lineOf(out.String(), "  "+svc+" ")
				if !strings.Contains(line, want) || !strings.HasSuffix(line, " ok") {
					t.Errorf("%s: %q, want %q", svc, line, want)
				}
			}
		})
	}
}

func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestSelecting checks the filter's events without root: Services enter
// and leave the selection by their labels.
func TestSelecting(t *testing.T) {
	ev := &fakeproxier.Events{}
	s := &selecting{Proxier: ev, selector: labels.SelectorFromSet(labels.Set{"expose": "true"})}
	svc := func(name string, expose bool) *v1.Service {
		l := map[string]string{}
		if expose {
			l["expose"] = "true"
		}
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	s.OnServiceAdd(svc("a", true))
	s.OnServiceAdd(svc("b", false))
	s.OnServiceUpdate(svc("a", true), svc("a", true))
	s.OnServiceUpdate(svc("b", false), svc("b", true)) // enters
	s.OnServiceUpdate(svc("a", true), svc("a", false)) // leaves
	s.OnServiceUpdate(svc("c", false), svc("c", false))
	s.OnServiceDelete(svc("b", true))
	s.OnServiceDelete(svc("c", false))
	got := ev.Take()
	want := []string{"svc+ a", "svc~ a", "svc+ b", "svc- a", "svc- b"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}
