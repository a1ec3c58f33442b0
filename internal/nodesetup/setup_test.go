package nodesetup

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Root-less tests: the max computation, and the setup logic against a
// fake system for what a test cannot do to a real host (raise the host's
// hash size, a read-only /sys, old kernels).

func TestConntrackMax(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Conntrack
		cpus int
		want int
	}{
		{"kube-proxy defaults, 2 CPUs: min wins", Conntrack{MaxPerCore: 32768, Min: 131072}, 2, 131072},
		{"kube-proxy defaults, 8 CPUs: per core", Conntrack{MaxPerCore: 32768, Min: 131072}, 8, 262144},
		{"per core equal to min", Conntrack{MaxPerCore: 32768, Min: 131072}, 4, 131072},
		{"capped at 1Mi", Conntrack{MaxPerCore: 32768, Min: 131072}, 64, ConntrackMaxLimit},
		{"exactly the cap is not capped", Conntrack{MaxPerCore: 32768}, 32, ConntrackMaxLimit},
		{"cap beats a larger min", Conntrack{MaxPerCore: 1 << 20, Min: 1 << 22}, 2, ConntrackMaxLimit},
		{"min above the cap beats a small product", Conntrack{MaxPerCore: 1, Min: 1 << 22}, 2, 1 << 22},
		{"no min", Conntrack{MaxPerCore: 100}, 3, 300},
		{"max per core 0 leaves it alone", Conntrack{Min: 131072}, 8, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ConntrackMax(tc.c, tc.cpus); got != tc.want {
				t.Errorf("ConntrackMax(%+v, %d) = %d, want %d", tc.c, tc.cpus, got, tc.want)
			}
		})
	}
}

func TestCountCPUList(t *testing.T) {
	for s, want := range map[string]int{"0": 1, "0-1\n": 2, "0-3,8,10-11": 7, "": 0, "3-1": 0, "x": 0} {
		if got := countCPUList(s); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestParseRelease(t *testing.T) {
	for r, want := range map[string][2]int{"6.18.44-fc-v595": {6, 18}, "4.1": {4, 1}, "5.8.0-1-amd64": {5, 8}} {
		maj, minor, ok := parseRelease(r)
		if !ok || maj != want[0] || minor != want[1] {
			t.Errorf("parseRelease(%q) = %d, %d, %v", r, maj, minor, ok)
		}
	}
	if _, _, ok := parseRelease("weird"); ok {
		t.Error("parseRelease(weird) ok")
	}
}

func TestNodePortsOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  bool
	}{
		{nil, true},
		{[]string{"2001:db8::/64"}, true}, // no IPv4 CIDR: every IPv4 address
		{[]string{"0.0.0.0/0"}, true},
		{[]string{"127.0.0.1/32"}, true},
		{[]string{"127.0.0.0/8", "192.0.2.0/24"}, true},
		{[]string{"192.0.2.1/32"}, false},
		{[]string{"192.0.2.1/32", "::1/128"}, false},
	} {
		got, err := nodePortsOnLoopback(tc.addrs)
		if err != nil || got != tc.want {
			t.Errorf("nodePortsOnLoopback(%v) = %v, %v; want %v", tc.addrs, got, err, tc.want)
		}
	}
	if _, err := nodePortsOnLoopback([]string{"primary"}); err == nil || !strings.Contains(err.Error(), "NodePortAddresses[0]") {
		t.Errorf("primary: %v", err)
	}
}

// fakeSys is a system in memory: files that exist, those without write
// permission, and errors for writes.
type fakeSys struct {
	files    map[string]string
	ro       map[string]bool
	writeErr map[string]error
	writes   []string
}

func (f *fakeSys) read(key string) (string, error) {
	v, ok := f.files[key]
	if !ok {
		return "", &fs.PathError{Op: "open", Path: key, Err: syscall.ENOENT}
	}
	return v, nil
}

func (f *fakeSys) write(key, value string) error {
	if err := f.writeErr[key]; err != nil {
		return &fs.PathError{Op: "write", Path: key, Err: err}
	}
	if _, ok := f.files[key]; !ok || f.ro[key] {
		return &fs.PathError{Op: "open", Path: key, Err: syscall.EACCES}
	}
	f.files[key] = value
	f.writes = append(f.writes, key+"="+value)
	return nil
}

func (f *fakeSys) checkWrite(key string) error {
	if _, ok := f.files[key]; !ok {
		return &fs.PathError{Op: "access", Path: key, Err: syscall.ENOENT}
	}
	if err := f.writeErr[key]; err != nil {
		return &fs.PathError{Op: "access", Path: key, Err: err}
	}
	if f.ro[key] {
		return &fs.PathError{Op: "access", Path: key, Err: syscall.EACCES}
	}
	return nil
}

// freshNS is what a new namespace shows on kernel 6.x, with the host's
// nf_conntrack_max and hash size.
func freshNS() *fakeSys {
	return &fakeSys{files: map[string]string{
		KeyConntrackMax:                "262144",
		HashsizePath:                   "65536",
		KeyTCPEstablishedTimeout:       "432000",
		KeyTCPCloseWaitTimeout:         "60",
		KeyTCPBeLiberal:                "0",
		KeyUDPTimeout:                  "30",
		KeyUDPStreamTimeout:            "120",
		KeyRouteLocalnet:               "0",
		KeyIPVSConntrack:               "0",
		KeyIPVSConnReuseMode:           "1",
		KeyIPVSExpireNoDestConn:        "0",
		KeyIPVSExpireQuiescentTemplate: "0",
		KeyIPForward:                   "0",
		KeyARPIgnore:                   "0",
		KeyARPAnnounce:                 "0",
	}, ro: map[string]bool{}, writeErr: map[string]error{}}
}

func runFake(t *testing.T, sys *fakeSys, initial, apply bool, release string, cfg Config) ([]Change, string, error) {
	t.Helper()
	if err := validate(cfg); err != nil {
		t.Fatalf("validate: %v", err)
	}
	var logs bytes.Buffer
	e := &env{sys: sys, initial: initial, numCPU: 2, release: release, apply: apply,
		netns: "/run/netns/test", log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	err := e.run(context.Background(), cfg)
	return e.changes, logs.String(), err
}

func TestSetupOrderAndValues(t *testing.T) {
	sys := freshNS()
	cfg := Config{
		Conntrack: Conntrack{MaxPerCore: 32768, Min: 131072 * 4, TCPEstablishedTimeout: 24 * time.Hour,
			TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 1500 * time.Millisecond, UDPStreamTimeout: 3 * time.Minute},
		Mode: "ipvs", IPVSStrictARP: true,
	}
	got, logs, err := runFake(t, sys, true, true, "5.4.0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{KeyConntrackMax, "262144", "524288"},
		{HashsizePath, "65536", "131072"},
		{KeyTCPEstablishedTimeout, "432000", "86400"},
		{KeyTCPCloseWaitTimeout, "60", "3600"},
		{KeyTCPBeLiberal, "0", "1"},
		{KeyUDPTimeout, "30", "1"}, // truncated to whole seconds, as kube-proxy
		{KeyUDPStreamTimeout, "120", "180"},
		{KeyIPVSConntrack, "0", "1"},
		{KeyIPVSConnReuseMode, "1", "0"}, // kernel 5.4: set
		{KeyIPVSExpireNoDestConn, "0", "1"},
		{KeyIPVSExpireQuiescentTemplate, "0", "1"},
		{KeyIPForward, "0", "1"},
		{KeyARPIgnore, "0", "1"},
		{KeyARPAnnounce, "0", "2"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	if n := strings.Count(logs, "Changed node setting"); n != len(want) {
		t.Errorf("%d change records logged, want %d:\n%s", n, len(want), logs)
	}
	again, _, err := runFake(t, sys, true, true, "5.4.0", cfg)
	if err != nil || len(again) != 0 {
		t.Errorf("second run: %v, %v", again, err)
	}
}

func TestSetupConntrackMaxRules(t *testing.T) {
	t.Run("lowered when it differs, hash size never lowered", func(t *testing.T) {
		sys := freshNS()
		got, _, err := runFake(t, sys, true, true, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 1000}})
		want := []Change{{KeyConntrackMax, "262144", "2000"}}
		if err != nil || !cmp.Equal(want, got) {
			t.Errorf("got %v, %v; want %v", got, err, want)
		}
		if sys.files[HashsizePath] != "65536" {
			t.Errorf("hash size %s", sys.files[HashsizePath])
		}
	})
	t.Run("read-only /sys is fatal", func(t *testing.T) {
		for _, apply := range []bool{true, false} {
			sys := freshNS()
			sys.writeErr[HashsizePath] = syscall.EROFS
			_, _, err := runFake(t, sys, true, apply, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 1 << 19}})
			var se *SettingError
			if !errors.As(err, &se) || se.Key != HashsizePath || !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), "/sys is read-only") {
				t.Errorf("apply=%v: err = %v", apply, err)
			}
			t.Log(err)
		}
	})
	t.Run("non-initial: equal max and enough hash size is fine", func(t *testing.T) {
		sys := freshNS()
		sys.ro[KeyConntrackMax] = true
		got, _, err := runFake(t, sys, false, true, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 131072}})
		if err != nil || len(got) != 0 || len(sys.writes) != 0 {
			t.Errorf("got %v, %v, writes %v", got, err, sys.writes)
		}
	})
	t.Run("non-initial: a different max is refused", func(t *testing.T) {
		for _, apply := range []bool{true, false} {
			sys := freshNS()
			sys.ro[KeyConntrackMax] = true
			_, _, err := runFake(t, sys, false, apply, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 32768, Min: 131072}})
			var se *SettingError
			if !errors.As(err, &se) || se.Key != KeyConntrackMax || !errors.Is(err, ErrHostGlobal) || !strings.Contains(err.Error(), "maxPerCore to 0") {
				t.Errorf("apply=%v: err = %v", apply, err)
			}
			if len(sys.writes) != 0 {
				t.Errorf("writes %v", sys.writes)
			}
		}
	})
	t.Run("non-initial: the host's hash size is never raised", func(t *testing.T) {
		sys := freshNS()
		sys.ro[KeyConntrackMax] = true
		sys.files[KeyConntrackMax] = "524288"
		_, _, err := runFake(t, sys, false, true, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 262144}})
		var se *SettingError
		if !errors.As(err, &se) || se.Key != HashsizePath || !errors.Is(err, ErrHostGlobal) {
			t.Errorf("err = %v", err)
		}
		if len(sys.writes) != 0 {
			t.Errorf("writes %v", sys.writes)
		}
	})
	t.Run("non-initial: a per-namespace max is written", func(t *testing.T) {
		sys := freshNS()
		got, _, err := runFake(t, sys, false, true, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{MaxPerCore: 65536}})
		want := []Change{{KeyConntrackMax, "262144", "131072"}}
		if err != nil || !cmp.Equal(want, got) {
			t.Errorf("got %v, %v; want %v", got, err, want)
		}
	})
}

func TestSetupIPVSKernels(t *testing.T) {
	for _, tc := range []struct {
		release string
		reuse   bool
		logged  string
	}{
		{"4.0.9", false, "level=ERROR msg=\"Can't set sysctl, kernel version doesn't satisfy minimum version requirements\""},
		{"4.1.0", true, ""},
		{"5.8.18", true, ""},
		{"5.9.0", false, "Left as-is"},
		{"6.18.44-fc-v595", false, "Left as-is"},
	} {
		got, logs, err := runFake(t, freshNS(), true, true, tc.release, Config{Mode: "ipvs"})
		if err != nil {
			t.Fatalf("%s: %v", tc.release, err)
		}
		reuse := false
		for _, c := range got {
			if c.Key == KeyIPVSConnReuseMode {
				reuse = true
			}
			if c.Key == KeyARPIgnore || c.Key == KeyARPAnnounce {
				t.Errorf("%s: strict ARP off but %v", tc.release, c)
			}
		}
		if reuse != tc.reuse || len(got) != 4+map[bool]int{true: 1}[tc.reuse] {
			t.Errorf("%s: changes %v", tc.release, got)
		}
		if !strings.Contains(logs, tc.logged) {
			t.Errorf("%s: log lacks %q:\n%s", tc.release, tc.logged, logs)
		}
	}
	_, _, err := runFake(t, freshNS(), true, true, "weird", Config{Mode: "ipvs"})
	if err == nil || !strings.Contains(err.Error(), "kernel version") {
		t.Errorf("unparsable release: %v", err)
	}
}

func TestSetupModes(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []Change
	}{
		{"empty mode is iptables", Config{LocalhostNodePorts: true}, []Change{{KeyRouteLocalnet, "0", "1"}}},
		{"iptables, localhost node ports off", Config{Mode: "iptables"}, nil},
		{"iptables, node ports not on loopback", Config{Mode: "iptables", LocalhostNodePorts: true, NodePortAddresses: []string{"192.0.2.0/24"}}, nil},
		{"iptables, node ports on 127.0.0.1", Config{Mode: "iptables", LocalhostNodePorts: true, NodePortAddresses: []string{"127.0.0.1/32"}}, []Change{{KeyRouteLocalnet, "0", "1"}}},
		{"nftables sets nothing", Config{Mode: "nftables", LocalhostNodePorts: true, IPVSStrictARP: true}, nil},
		{"ebpf sets nothing", Config{Mode: "ebpf", LocalhostNodePorts: true, IPVSStrictARP: true}, nil},
		{"be_liberal false never writes 0", Config{Mode: "nftables"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := freshNS()
			sys.files[KeyTCPBeLiberal] = "1"
			got, _, err := runFake(t, sys, true, true, "6.1", tc.cfg)
			if err != nil || !cmp.Equal(tc.want, got) {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestSetupMissingAndReadOnlySysctls(t *testing.T) {
	for _, apply := range []bool{true, false} {
		sys := freshNS()
		for k := range sys.files {
			if strings.HasPrefix(k, "net/ipv4/vs/") {
				delete(sys.files, k)
			}
		}
		_, _, err := runFake(t, sys, true, apply, "6.1", Config{Mode: "ipvs"})
		var se *SettingError
		if !errors.As(err, &se) || se.Key != KeyIPVSConntrack || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "ip_vs module") {
			t.Errorf("apply=%v: missing ip_vs: %v", apply, err)
		}

		sys = freshNS()
		sys.ro[KeyTCPBeLiberal] = true
		_, _, err = runFake(t, sys, true, apply, "6.1", Config{Mode: "nftables", Conntrack: Conntrack{TCPBeLiberal: true}})
		if !errors.As(err, &se) || se.Key != KeyTCPBeLiberal || !errors.Is(err, fs.ErrPermission) {
			t.Errorf("apply=%v: read-only: %v", apply, err)
		}
	}
}

func TestPlanWritesNothing(t *testing.T) {
	sys := freshNS()
	cfg := Config{Mode: "ipvs", IPVSStrictARP: true, Conntrack: Conntrack{MaxPerCore: 1 << 19, TCPBeLiberal: true, UDPTimeout: time.Minute}}
	planned, logs, err := runFake(t, sys, true, false, "6.1", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(sys.writes) != 0 || strings.Contains(logs, "level=INFO msg=\"Changed") {
		t.Errorf("plan wrote %v or logged a change:\n%s", sys.writes, logs)
	}
	applied, _, err := runFake(t, sys, true, true, "6.1", cfg)
	if err != nil || !cmp.Equal(planned, applied) {
		t.Errorf("plan %v, apply %v, %v", planned, applied, err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Mode: "userspace"}, "Config.Mode"},
		{Config{Conntrack: Conntrack{MaxPerCore: -1}}, "Conntrack.MaxPerCore"},
		{Config{Conntrack: Conntrack{UDPTimeout: -time.Second}}, "Conntrack.UDPTimeout"},
		{Config{NodePortAddresses: []string{"10.0.0.1"}}, "NodePortAddresses[0]"},
		{Config{NumCPU: -2}, "NumCPU"},
	} {
		if err := validate(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want one naming %s", tc.cfg, err, tc.want)
		}
	}
}
