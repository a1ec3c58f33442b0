package ipvs

import (
	"os"
	"os/exec"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// EnvRequireIPVS set to "1" turns a missing IPVS or dummy driver into a
// test failure instead of a skip. The VM runner (internal/vmtest) sets it,
// since its kernel has both.
const EnvRequireIPVS = "PROXYKIT_REQUIRE_IPVS"

// requireIPVS skips the test unless the process may create network
// namespaces (testnet.RequireRoot) and the kernel has IPVS and the dummy
// interface driver, loading the modules if needed. With
// PROXYKIT_REQUIRE_IPVS=1 a missing module fails the test.
func requireIPVS(tb testing.TB) {
	tb.Helper()
	testnet.RequireRoot(tb)
	for _, m := range []struct{ module, probe, what string }{
		{"ip_vs", "/proc/net/ip_vs", "IPVS"},
		{"dummy", "/sys/module/dummy", "the dummy interface driver"},
	} {
		if _, err := os.Stat(m.probe); err == nil {
			continue
		}
		_ = exec.Command("modprobe", m.module).Run()
		if _, err := os.Stat(m.probe); err == nil {
			continue
		}
		msg := "requires " + m.what + ": this kernel has no " + m.module + " module (" + m.probe +
			" is missing); run the test in a VM with hack/vmtest.sh ./backends/ipvs/"
		if os.Getenv(EnvRequireIPVS) == "1" {
			tb.Fatalf("%s (a failure, not a skip, because %s=1)", msg, EnvRequireIPVS)
		}
		tb.Skip(msg)
	}
}

// haveIPVS reports whether the kernel has IPVS, without loading it.
func haveIPVS() bool {
	_, err := os.Stat("/proc/net/ip_vs")
	return err == nil
}
