package sandbox

import (
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// RequirePrivilege skips a test unless the process may build a sandbox
// (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN in the initial user
// namespace). With CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1 in the
// environment the missing privilege fails the test instead, so that a CI
// run cannot pass by skipping. It is the only function of the package that
// reads the environment.
func RequirePrivilege(tb testing.TB) {
	tb.Helper()
	testnet.RequireRoot(tb)
}
