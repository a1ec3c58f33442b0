package vmtest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readCpio parses a newc archive: name -> (mode, content).
func readCpio(t *testing.T, b []byte) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for off := 0; ; {
		if len(b) < off+cpioHeaderLen || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(b[off+cpioHeaderLen : off+cpioHeaderLen+nameLen-1])
		off = (off + cpioHeaderLen + nameLen + 3) &^ 3
		data := string(b[off : off+size])
		off = (off + size + 3) &^ 3
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = [2]string{fmt.Sprintf("%o", mode), data}
	}
}

func TestArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	os.WriteFile(src, []byte("hello"), 0o750)
	a := newArchive()
	if err := a.addFile("/usr/lib/x/f", src); err != nil {
		t.Fatal(err)
	}
	a.addBytes("init", []byte("#!/bin/sh\n"), 0o755)
	a.addSymlink("usr/sbin/iptables", "/usr/sbin/xtables-nft-multi")
	a.addDir("proc", 0o755)
	var buf bytes.Buffer
	if err := a.write(&buf); err != nil {
		t.Fatal(err)
	}
	got := readCpio(t, buf.Bytes())
	want := map[string][2]string{
		"init":              {"100755", "#!/bin/sh\n"},
		"proc":              {"40755", ""},
		"usr":               {"40755", ""},
		"usr/lib":           {"40755", ""},
		"usr/lib/x":         {"40755", ""},
		"usr/lib/x/f":       {"100750", "hello"},
		"usr/sbin":          {"40755", ""},
		"usr/sbin/iptables": {"120777", "/usr/sbin/xtables-nft-multi"},
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("archive holds %d entries, want %d: %v", len(got), len(want), got)
	}
	// Directories precede their content.
	var names []string
	for off, b := 0, buf.Bytes(); off < len(b); {
		nameLen, _ := strconv.ParseUint(string(b[off+94:off+102]), 16, 32)
		size, _ := strconv.ParseUint(string(b[off+54:off+62]), 16, 32)
		names = append(names, string(b[off+cpioHeaderLen:off+cpioHeaderLen+int(nameLen)-1]))
		off = (off + cpioHeaderLen + int(nameLen) + 3) &^ 3
		off = (off + int(size) + 3) &^ 3
	}
	if i, j := slices.Index(names, "usr/lib"), slices.Index(names, "usr/lib/x/f"); i < 0 || i > j {
		t.Errorf("order: %v", names)
	}
}

func TestModuleClosure(t *testing.T) {
	dep := `kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko
kernel/net/netfilter/nf_conntrack.ko: kernel/lib/libcrc32c.ko
kernel/lib/libcrc32c.ko:
kernel/net/netfilter/nft_ct.ko: kernel/net/netfilter/nf_tables.ko
kernel/net/netfilter/nf_tables.ko:
kernel/drivers/net/dummy.ko:
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko
kernel/net/9p/9pnet.ko:
kernel/drivers/char/hw_random/virtio-rng.ko:
`
	idx, err := parseModulesDep(strings.NewReader(dep))
	if err != nil {
		t.Fatal(err)
	}
	paths, unknown := idx.closure([]string{"ip_vs", "dummy", "virtio_rng", "nft_counter"}, nil)
	want := []string{"kernel/drivers/char/hw_random/virtio-rng.ko", "kernel/drivers/net/dummy.ko", "kernel/lib/libcrc32c.ko",
		"kernel/net/netfilter/ipvs/ip_vs.ko", "kernel/net/netfilter/nf_conntrack.ko"}
	if !slices.Equal(paths, want) {
		t.Errorf("closure %v, want %v", paths, want)
	}
	if !slices.Equal(unknown, []string{"nft_counter"}) {
		t.Errorf("unknown %v", unknown)
	}
	paths, _ = idx.closure(nil, []string{"kernel/net/netfilter/"})
	if !slices.Contains(paths, "kernel/net/netfilter/nft_ct.ko") || !slices.Contains(paths, "kernel/lib/libcrc32c.ko") || slices.Contains(paths, "kernel/fs/9p/9p.ko") {
		t.Errorf("directory closure %v", paths)
	}
}

func TestKernelPackageResolution(t *testing.T) {
	pkg, v := kernelDependency("linux-image-6.1.0-56-amd64 (= 6.1.192-2)")
	if pkg != "linux-image-6.1.0-56-amd64" || v != "6.1.192-2" {
		t.Errorf("got %q %q", pkg, v)
	}
	pkg, v = kernelDependency("initramfs-tools | linux-initramfs-tool, linux-image-6.12.1-amd64")
	if pkg != "linux-image-6.12.1-amd64" || v != "" {
		t.Errorf("got %q %q", pkg, v)
	}
	stanza := "Package: linux-image-amd64\nVersion: 6.1.192-2\nDepends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\n"
	if got := controlField(stanza, "Depends"); got != "linux-image-6.1.0-56-amd64 (= 6.1.192-2)" {
		t.Errorf("Depends: %q", got)
	}
	for name, want := range map[string]bool{
		"boot/vmlinuz-6.1.0-56-amd64":                                        true,
		"boot/System.map-6.1.0-56-amd64":                                     false,
		"lib/modules/6.1.0-56-amd64/modules.order":                           true,
		"lib/modules/6.1.0-56-amd64/kernel/net/netfilter/ipvs/ip_vs.ko":      true,
		"lib/modules/6.1.0-56-amd64/kernel/drivers/net/dummy.ko":             true,
		"lib/modules/6.1.0-56-amd64/kernel/drivers/net/dummy_hcd.ko":         false,
		"lib/modules/6.1.0-56-amd64/kernel/drivers/gpu/drm/virtio/virtio.ko": false,
	} {
		if got := wantKernelFile(name); got != want {
			t.Errorf("wantKernelFile(%s) = %v", name, got)
		}
	}
}

func TestExtractKernelTar(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct{ name, body string }{
		{"./boot/vmlinuz-6.1.0-9-amd64", "kernel"},
		{"./boot/config-6.1.0-9-amd64", "config"},
		{"./lib/modules/6.1.0-9-amd64/kernel/net/netfilter/ipvs/ip_vs.ko", "module"},
		{"./lib/modules/6.1.0-9-amd64/kernel/sound/snd.ko", "module"},
	} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(f.body))
	}
	tw.Close()
	root := t.TempDir()
	rel, err := extractKernelTar(&buf, root)
	if err != nil || rel != "6.1.0-9-amd64" {
		t.Fatalf("release %q, %v", rel, err)
	}
	for p, want := range map[string]bool{
		"boot/vmlinuz-6.1.0-9-amd64": true, "boot/config-6.1.0-9-amd64": false,
		"lib/modules/6.1.0-9-amd64/kernel/net/netfilter/ipvs/ip_vs.ko": true,
		"lib/modules/6.1.0-9-amd64/kernel/sound/snd.ko":                false,
	} {
		if _, err := os.Stat(filepath.Join(root, p)); (err == nil) != want {
			t.Errorf("%s extracted: %v, want %v", p, err == nil, want)
		}
	}
}

func TestTestBinaryArgs(t *testing.T) {
	got := testBinaryArgs([]string{"-run", "Conformance/ClusterIP", "-count=1", "-test.v", "-parallel", "4"})
	want := []string{"-test.run", "Conformance/ClusterIP", "-test.count=1", "-test.v", "-test.parallel", "4"}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}

func TestInitScript(t *testing.T) {
	s := initScript(initConfig{
		BootModules: []string{"virtio_pci", "9p"},
		Modules:     []string{"ip_vs"},
		SrcDir:      "/work/main",
		Jobs:        []testJob{{Package: "example.com/p", Binary: "00-p.test", Dir: "/work/main/p", Out: "00"}},
		TestArgs:    []string{"-test.run", "A B"},
		TestTimeout: 5 * time.Minute,
		Env:         []string{"PROXYKIT_REQUIRE_IPVS=1"},
	})
	for _, want := range []string{
		"load virtio_pci 9p\n",
		"mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none pkshare /pk",
		"pksrc /work/main",
		"export PROXYKIT_REQUIRE_IPVS=1",
		"/pk/bin/00-p.test -test.v=test2json -test.paniconexit0 -test.timeout=5m0s -test.run 'A B' >/pk/out/00.out 2>&1",
		"mv /pk/out/00.rc.tmp /pk/out/00.rc",
		"heartbeat: ${now}s",
		"-gt 315 ]; then echo \"heartbeat: a test binary ran past its timeout; blocked tasks:\"; echo w > /proc/sysrq-trigger",
		"poweroff -f",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
	if got := shQuote("it's"); got != `'it'\''s'` {
		t.Errorf("shQuote: %s", got)
	}
}

func TestReporter(t *testing.T) {
	var out bytes.Buffer
	res := &Result{}
	r := newReporter(&out, false, false, res)
	r.start("example.com/p")
	for _, ev := range []event{
		{Action: "run", Test: "TestA"},
		{Action: "output", Test: "TestA", Output: "=== RUN   TestA\n"},
		{Action: "output", Test: "TestA", Output: "    a_test.go:1: noise\n"},
		{Action: "output", Test: "TestA", Output: "--- PASS: TestA (0.00s)\n"},
		{Action: "pass", Test: "TestA"},
		{Action: "output", Test: "TestB", Output: "    b_test.go:9: broken\n"},
		{Action: "output", Test: "TestB", Output: "--- FAIL: TestB (0.01s)\n"},
		{Action: "fail", Test: "TestB"},
		{Action: "output", Test: "TestC", Output: "    c_test.go:3: requires IPVS\n"},
		{Action: "output", Test: "TestC", Output: "--- SKIP: TestC (0.00s)\n"},
		{Action: "skip", Test: "TestC"},
		{Action: "output", Test: "BenchmarkX", Output: "BenchmarkX-2   \t"},
		{Action: "output", Test: "BenchmarkX", Output: "     100\t   3829833 ns/op\n"},
	} {
		b, _ := json.Marshal(ev)
		r.line(b)
	}
	r.finish(&PackageResult{Package: "example.com/p", Status: "FAIL", Elapsed: 1500 * time.Millisecond})
	res.Packages = append(res.Packages, &PackageResult{Status: "FAIL"})
	r.summary()
	want := "    b_test.go:9: broken\n--- FAIL: TestB (0.01s)\n    c_test.go:3: requires IPVS\n--- SKIP: TestC (0.00s)\n" +
		"BenchmarkX-2   \t     100\t   3829833 ns/op\n" +
		"FAIL\texample.com/p\t1.500s\nFAIL\nvmtest: 1 passed, 1 failed, 1 skipped\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestReporterUnfinished: a test that never ends (a hang, or a timeout's
// panic whose process cannot exit) still has its output printed.
func TestReporterUnfinished(t *testing.T) {
	var out bytes.Buffer
	r := newReporter(&out, false, false, &Result{})
	r.start("example.com/p")
	for _, ev := range []event{
		{Action: "run", Test: "TestA"},
		{Action: "output", Test: "TestA", Output: "    a_test.go:1: fine\n"},
		{Action: "output", Test: "TestA", Output: "--- PASS: TestA (0.00s)\n"},
		{Action: "pass", Test: "TestA"},
		{Action: "run", Test: "TestHung/IPv6"},
		{Action: "output", Test: "TestHung/IPv6", Output: "=== RUN   TestHung/IPv6\n"},
		{Action: "output", Test: "TestHung/IPv6", Output: "    h_test.go:7: waiting for the kernel\n"},
	} {
		b, _ := json.Marshal(ev)
		r.line(b)
	}
	r.printUnfinished()
	want := "vmtest: TestHung/IPv6 did not finish; its last output:\n    h_test.go:7: waiting for the kernel\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestTailFile(t *testing.T) {
	dir := t.TempDir()
	out, done := filepath.Join(dir, "x.out"), filepath.Join(dir, "x.rc")
	exited := make(chan struct{})
	go func() {
		f, _ := os.Create(out)
		for i := range 5 {
			fmt.Fprintf(f, "line %d\n", i)
			time.Sleep(30 * time.Millisecond)
		}
		f.Close()
		os.WriteFile(done, []byte("0 1.5\n"), 0o644)
	}()
	var got bytes.Buffer
	if !tailFile(out, done, exited, &got) {
		t.Fatal("output never appeared")
	}
	if want := "line 0\nline 1\nline 2\nline 3\nline 4\n"; got.String() != want {
		t.Errorf("got %q", got.String())
	}
	if rc, d := readStatus(done); rc != 0 || d != 1500*time.Millisecond {
		t.Errorf("status %d %v", rc, d)
	}
	if rc, _ := readStatus(filepath.Join(dir, "missing")); rc != -1 {
		t.Errorf("missing status %d", rc)
	}
	// A VM that ends before a binary ran: nothing to read.
	close(exited)
	if tailFile(filepath.Join(dir, "never.out"), filepath.Join(dir, "never.rc"), exited, io.Discard) {
		t.Error("tailFile reported output that never appeared")
	}
}

func TestElfDeps(t *testing.T) {
	// The test binary itself: static with CGO_ENABLED=0, else it names
	// libc and the loader; either way elfDeps must read it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	interp, needed, err := elfDeps(self)
	if err != nil {
		t.Fatal(err)
	}
	static, err := isStatic(self)
	if err != nil {
		t.Fatal(err)
	}
	if static != (interp == "") {
		t.Errorf("isStatic %v but interpreter %q", static, interp)
	}
	for _, n := range needed {
		if findLib(n) == "" {
			t.Errorf("library %s of the test binary not found", n)
		}
	}
}
