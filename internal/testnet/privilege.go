package testnet

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Environment variables that turn a missing privilege or tool into a test
// failure instead of a skip.
const (
	// EnvCI is set to "true" by most CI systems.
	EnvCI = "CI"
	// EnvRequirePrivileged set to "1" makes privileged tests mandatory.
	EnvRequirePrivileged = "PROXYKIT_REQUIRE_PRIVILEGED"
)

// Capabilities the harness needs: CAP_NET_ADMIN to configure namespaces,
// CAP_SYS_ADMIN to create, mount and enter them.
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// ErrNotPrivileged is matched by the error of [Build] when the process may
// not create and configure network namespaces.
var ErrNotPrivileged = errors.New("not privileged to create network namespaces (run as root)")

// Mandatory reports whether privileged tests must run: CI=true or
// PROXYKIT_REQUIRE_PRIVILEGED=1.
func Mandatory() bool {
	return os.Getenv(EnvCI) == "true" || os.Getenv(EnvRequirePrivileged) == "1"
}

// RequireRoot skips the test unless the process may create and configure
// network namespaces (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN). When
// [Mandatory] reports true, the missing privilege fails the test instead.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if err := checkPrivilege(); err != nil {
		skipOrFail(tb, fmt.Sprintf("requires root: %v; run the tests as root (sudo)", err))
	}
}

// RequireCommand skips the test unless the named program is in PATH, or
// fails it when [Mandatory] reports true.
func RequireCommand(tb testing.TB, name string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		skipOrFail(tb, fmt.Sprintf("requires the %s command: %v", name, err))
	}
}

func skipOrFail(tb testing.TB, msg string) {
	tb.Helper()
	if Mandatory() {
		tb.Fatalf("%s (a failure, not a skip, because %s=true or %s=1)", msg, EnvCI, EnvRequirePrivileged)
	}
	tb.Skipf("%s (set %s=1 to make this a failure)", msg, EnvRequirePrivileged)
}

// checkPrivilege returns nil when the effective capability set holds
// CAP_SYS_ADMIN and CAP_NET_ADMIN and runs in the initial user namespace.
func checkPrivilege() error {
	caps, err := effectiveCaps()
	if err != nil {
		return err
	}
	var missing []string
	if caps&(1<<capNetAdmin) == 0 {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if caps&(1<<capSysAdmin) == 0 {
		missing = append(missing, "CAP_SYS_ADMIN")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (euid %d)", strings.Join(missing, ", "), os.Geteuid())
	}
	// Capabilities in a user namespace of our own (unshare -r) do not
	// allow mounting under /var/run/netns. The initial user namespace
	// maps every uid onto itself.
	if m, err := os.ReadFile("/proc/self/uid_map"); err != nil || strings.Join(strings.Fields(string(m)), " ") != "0 0 4294967295" {
		return fmt.Errorf("not in the initial user namespace")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("no network namespace support: %w", err)
	}
	return nil
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff in /proc/self/status")
}
