package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/sandbox"
)

// TestAgent runs the agent. It checks every claim it prints with real
// traffic in its sandbox (the proxier in a pod's namespace balances the
// agent's services, an agent event reprograms it, the agent's own table
// keeps working beside proxykit's through a restart and a Cleanup) and
// fails if one does not hold.
func TestAgent(t *testing.T) {
	sandbox.RequirePrivilege(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"tables in node1-pod1's namespace: inet cni-agent, ip proxykit",
		"after the proxier's Cleanup: inet cni-agent (",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(out.String(), " ok\n"); n != 7 {
		t.Errorf("%d checks passed, want 7", n)
	}
}
