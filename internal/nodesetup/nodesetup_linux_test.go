package nodesetup

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testnet"
)

// Privileged tests: Apply and Plan in a throwaway namespace of a testnet
// topology. They never write the host's namespace or host-global files;
// each checks at the end that the host's values did not change.

// envRequireIPVS set to "1" makes the IPVS case fail, instead of taking
// the refusal path, when the kernel has no IPVS (hack/vmtest.sh sets it).
const envRequireIPVS = "PROXYKIT_REQUIRE_IPVS"

// hostKeys are the host values the tests watch.
var hostKeys = []string{
	KeyConntrackMax, HashsizePath, KeyTCPEstablishedTimeout, KeyTCPCloseWaitTimeout,
	KeyTCPBeLiberal, KeyUDPTimeout, KeyUDPStreamTimeout, KeyRouteLocalnet,
	KeyIPForward, KeyARPIgnore, KeyARPAnnounce,
}

// newNS builds a topology and returns node1's namespace; at the end of
// the test it checks that the host's own values are as before.
func newNS(t *testing.T) *testnet.NS {
	t.Helper()
	testnet.RequireRoot(t)
	if _, err := os.Stat("/proc/sys/" + KeyConntrackMax); err != nil {
		msg := "requires nf_conntrack: " + err.Error()
		if testnet.Mandatory() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	before := readHost(t)
	t.Cleanup(func() {
		if d := cmp.Diff(before, readHost(t)); d != "" {
			t.Errorf("the host's settings changed (-before +after):\n%s", d)
		}
	})
	return testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1}).Node1.NS
}

func readHost(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range hostKeys {
		b, err := os.ReadFile(sysPath(k))
		if err != nil {
			m[k] = "error: " + err.Error()
			continue
		}
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

func sysctl(t *testing.T, ns *testnet.NS, key string) string {
	t.Helper()
	v, err := ns.Sysctl(key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// logged returns the changes logged at Info in JSON records.
func logged(t *testing.T, buf *bytes.Buffer) []Change {
	t.Helper()
	var out []Change
	s := bufio.NewScanner(buf)
	for s.Scan() {
		var r struct{ Level, Msg, Key, Old, New, NetNS string }
		if err := json.Unmarshal(s.Bytes(), &r); err != nil {
			t.Fatalf("log record %s: %v", s.Text(), err)
		}
		if r.Msg == "Changed node setting" {
			if r.Level != "INFO" {
				t.Errorf("change logged at %s", r.Level)
			}
			out = append(out, Change{Key: r.Key, Old: r.Old, New: r.New})
		}
	}
	return out
}

func fullConfig(path string) Config {
	return Config{
		NetNS: path,
		Conntrack: Conntrack{
			TCPEstablishedTimeout: 24 * time.Hour,
			TCPCloseWaitTimeout:   time.Hour,
			TCPBeLiberal:          true,
			UDPTimeout:            45 * time.Second,
			UDPStreamTimeout:      150 * time.Second,
		},
		Mode:               "iptables",
		LocalhostNodePorts: true,
	}
}

func TestApplyInNamespace(t *testing.T) {
	ns := newNS(t)
	var want []Change
	for _, kv := range [][2]string{
		{KeyTCPEstablishedTimeout, "86400"},
		{KeyTCPCloseWaitTimeout, "3600"},
		{KeyTCPBeLiberal, "1"},
		{KeyUDPTimeout, "45"},
		{KeyUDPStreamTimeout, "150"},
		{KeyRouteLocalnet, "1"},
	} {
		if old := sysctl(t, ns, kv[0]); old != kv[1] {
			want = append(want, Change{Key: kv[0], Old: old, New: kv[1]})
		}
	}
	if len(want) < 5 {
		t.Fatalf("a fresh namespace should differ from the test's values: %v", want)
	}

	var logs bytes.Buffer
	cfg := fullConfig(ns.Path())
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	got, err := Apply(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, logged(t, &logs)); d != "" {
		t.Errorf("logged changes (-want +got):\n%s", d)
	}
	for _, c := range want {
		if v := sysctl(t, ns, c.Key); v != c.New {
			t.Errorf("%s = %s after Apply, want %s", c.Key, v, c.New)
		}
	}

	logs.Reset()
	again, err := Apply(t.Context(), cfg)
	if err != nil || len(again) != 0 {
		t.Errorf("second Apply: %v, %v; want no change", again, err)
	}
	if l := logged(t, &logs); len(l) != 0 {
		t.Errorf("second Apply logged %v", l)
	}
}

func TestZeroFieldsLeaveSettingsAlone(t *testing.T) {
	ns := newNS(t)
	// Values a zero field must not touch, be_liberal=1 included (false
	// never writes 0).
	preset := map[string]string{
		KeyTCPEstablishedTimeout: "1234",
		KeyTCPBeLiberal:          "1",
		KeyUDPTimeout:            "17",
		KeyRouteLocalnet:         "0",
	}
	for k, v := range preset {
		if err := ns.SetSysctl(k, v); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]string{}
	for _, k := range hostKeys[2:] {
		before[k] = sysctl(t, ns, k)
	}
	for _, cfg := range []Config{
		{NetNS: ns.Path(), Mode: "nftables"},
		{NetNS: ns.Path(), Mode: "ebpf"},
		{NetNS: ns.Path(), Mode: "iptables"}, // localhost node ports off
		{NetNS: ns.Path(), Mode: "iptables", LocalhostNodePorts: true, NodePortAddresses: []string{"198.51.100.0/24"}},
		{NetNS: ns.Path(), Mode: "nftables", Conntrack: Conntrack{Min: 1 << 30}}, // MaxPerCore 0: Min ignored
	} {
		got, err := Apply(t.Context(), cfg)
		if err != nil || len(got) != 0 {
			t.Errorf("Apply(%+v) = %v, %v; want no change", cfg, got, err)
		}
	}
	for k, v := range before {
		if now := sysctl(t, ns, k); now != v {
			t.Errorf("%s changed from %s to %s", k, v, now)
		}
	}
}

func TestPlanChangesNothing(t *testing.T) {
	ns := newNS(t)
	cfg := fullConfig(ns.Path())
	before := map[string]string{}
	for _, k := range hostKeys[2:] {
		before[k] = sysctl(t, ns, k)
	}
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	planned, err := Plan(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(planned) == 0 {
		t.Fatal("Plan found nothing to change in a fresh namespace")
	}
	for k, v := range before {
		if now := sysctl(t, ns, k); now != v {
			t.Errorf("Plan changed %s from %s to %s", k, v, now)
		}
	}
	if l := logged(t, &logs); len(l) != 0 {
		t.Errorf("Plan logged changes at Info: %v", l)
	}
	cfg.Logger = nil
	applied, err := Apply(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(planned, applied); d != "" {
		t.Errorf("Plan and Apply differ (-plan +apply):\n%s", d)
	}
	if again, err := Plan(t.Context(), cfg); err != nil || len(again) != 0 {
		t.Errorf("Plan after Apply: %v, %v", again, err)
	}
}

// TestConntrackMaxNonInitialNamespace is the documented result of the
// host-global settings from a namespace other than the initial one: a
// value that already satisfies the configuration is accepted, another is
// refused with ErrHostGlobal, and nothing of the host is written (newNS
// checks the host's nf_conntrack_max and hash size at the end).
func TestConntrackMaxNonInitialNamespace(t *testing.T) {
	ns := newNS(t)
	cur, err := strconv.Atoi(sysctl(t, ns, KeyConntrackMax))
	if err != nil {
		t.Fatal(err)
	}
	hash, err := strconv.Atoi(readHost(t)[HashsizePath])
	if err != nil {
		t.Fatalf("hash size: %v", err)
	}
	var perNS bool
	if err := ns.Do(func() error {
		fi, err := os.Stat("/proc/sys/" + KeyConntrackMax)
		perNS = err == nil && fi.Mode().Perm()&0o222 != 0
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if perNS {
		t.Logf("this kernel lets a namespace write nf_conntrack_max: it is per namespace")
	}

	t.Run("already satisfied", func(t *testing.T) {
		// 1 per core on 1 CPU, at least the current value: exactly it.
		cfg := Config{NetNS: ns.Path(), Mode: "nftables", NumCPU: 1, Conntrack: Conntrack{MaxPerCore: 1, Min: int32(cur)}}
		for _, f := range []func() ([]Change, error){
			func() ([]Change, error) { return Plan(t.Context(), cfg) },
			func() ([]Change, error) { return Apply(t.Context(), cfg) },
		} {
			got, err := f()
			if hash >= cur/4 {
				if err != nil || len(got) != 0 {
					t.Errorf("got %v, %v; want no change", got, err)
				}
			} else if !errors.Is(err, ErrHostGlobal) || !strings.Contains(err.Error(), HashsizePath) {
				t.Errorf("host hash size %d < %d/4: err = %v, want ErrHostGlobal naming the hash size", hash, cur, err)
			}
		}
	})

	t.Run("different", func(t *testing.T) {
		var logs bytes.Buffer
		cfg := Config{NetNS: ns.Path(), Mode: "nftables", NumCPU: 1,
			Conntrack: Conntrack{MaxPerCore: 1, Min: int32(cur + 4), TCPEstablishedTimeout: time.Hour},
			Logger:    slog.New(slog.NewJSONHandler(&logs, nil))}
		estBefore := sysctl(t, ns, KeyTCPEstablishedTimeout)
		for name, f := range map[string]func() ([]Change, error){
			"Plan":  func() ([]Change, error) { return Plan(t.Context(), cfg) },
			"Apply": func() ([]Change, error) { return Apply(t.Context(), cfg) },
		} {
			got, err := f()
			if perNS {
				continue
			}
			var se *SettingError
			if !errors.As(err, &se) || se.Key != KeyConntrackMax || !errors.Is(err, ErrHostGlobal) ||
				se.NetNS != ns.Path() || !strings.Contains(err.Error(), "maxPerCore to 0") {
				t.Errorf("%s: err = %v; want a SettingError for %s matching ErrHostGlobal", name, err, KeyConntrackMax)
			}
			if len(got) != 0 {
				t.Errorf("%s: changes %v", name, got)
			}
			t.Logf("%s: %v", name, err)
		}
		if perNS {
			return
		}
		// Apply stopped at the refused setting, before the timeouts.
		if v := sysctl(t, ns, KeyTCPEstablishedTimeout); v != estBefore {
			t.Errorf("timeout set after the refusal: %s", v)
		}
		if l := logged(t, &logs); len(l) != 0 {
			t.Errorf("logged %v", l)
		}
	})
}

func TestIPVSMode(t *testing.T) {
	ns := newNS(t)
	cfg := Config{NetNS: ns.Path(), Mode: "ipvs", IPVSStrictARP: true}
	var hasIPVS bool
	if err := ns.Do(func() error {
		_, err := os.Stat("/proc/sys/net/ipv4/vs")
		hasIPVS = err == nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !hasIPVS {
		if os.Getenv(envRequireIPVS) == "1" {
			t.Fatalf("no IPVS sysctls in the namespace, and %s=1", envRequireIPVS)
		}
		// kube-proxy fails here too (EnsureSysctl of vs/conntrack).
		for _, f := range []func(context.Context, Config) ([]Change, error){Plan, Apply} {
			got, err := f(t.Context(), cfg)
			var se *SettingError
			if !errors.As(err, &se) || se.Key != KeyIPVSConntrack || !errors.Is(err, fs.ErrNotExist) || len(got) != 0 {
				t.Errorf("without IPVS: %v, %v; want a SettingError for %s", got, err, KeyIPVSConntrack)
			}
			t.Logf("without IPVS: %v", err)
		}
		return
	}
	got, err := Apply(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		KeyIPVSConntrack: "1", KeyIPVSExpireNoDestConn: "1", KeyIPVSExpireQuiescentTemplate: "1",
		KeyIPForward: "1", KeyARPIgnore: "1", KeyARPAnnounce: "2",
	} {
		if now := sysctl(t, ns, k); now != v {
			t.Errorf("%s = %s, want %s", k, now, v)
		}
	}
	t.Logf("changes: %v", got)
	if again, err := Apply(t.Context(), cfg); err != nil || len(again) != 0 {
		t.Errorf("second Apply: %v, %v", again, err)
	}
}

func TestBadNamespace(t *testing.T) {
	testnet.RequireRoot(t)
	notNS := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notNS, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/var/run/netns/pk-does-not-exist", notNS} {
		for _, f := range []func(context.Context, Config) ([]Change, error){Plan, Apply} {
			got, err := f(t.Context(), Config{NetNS: path, Mode: "nftables", Conntrack: Conntrack{TCPBeLiberal: true}})
			if err == nil || !strings.Contains(err.Error(), path) || len(got) != 0 {
				t.Errorf("%s: %v, %v; want an error naming the path", path, got, err)
			}
		}
	}
}

// TestCheckWriteReadOnlyMount proves on a real read-only mount what the
// read-only /sys case relies on: access(2) reports EROFS before any
// write. The mount lives in a private mount namespace of one thread,
// which is discarded afterwards.
func TestCheckWriteReadOnlyMount(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			// Keep every mount below from propagating to the host.
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make / private: %w", err)
			}
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
				return fmt.Errorf("mount tmpfs: %w", err)
			}
			file := filepath.Join(dir, "hashsize")
			if err := os.WriteFile(file, []byte("16384"), 0o600); err != nil {
				return err
			}
			if err := (procSys{}).checkWrite(file); err != nil {
				return fmt.Errorf("writable file: %w", err)
			}
			if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return fmt.Errorf("remount read-only: %w", err)
			}
			if err := (procSys{}).checkWrite(file); !errors.Is(err, syscall.EROFS) {
				return fmt.Errorf("checkWrite on a read-only mount = %v, want EROFS", err)
			}
			if err := (procSys{}).write(file, "65536"); !errors.Is(err, syscall.EROFS) {
				return fmt.Errorf("write on a read-only mount = %v, want EROFS", err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
