package nftables

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The benchmarks load kube-proxy's nftables layout for the same services
// (internal/scale.KubeProxyNFT, shared with the cross-backend
// benchmark tool) with `nft -f`, next to this backend's figures.

// nftFile runs `nft -f` on script in ns and returns how long it took.
func nftFile(tb testing.TB, ns *testNS, script string) time.Duration {
	tb.Helper()
	f := filepath.Join(tb.TempDir(), "ruleset.nft")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command("ip", "netns", "exec", ns.name, "nft", "-f", f).CombinedOutput()
	d := time.Since(start)
	if err != nil {
		tb.Fatalf("nft -f: %v\n%.2000s", err, out)
	}
	return d
}
