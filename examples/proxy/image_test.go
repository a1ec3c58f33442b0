package main_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/sandbox"
	v1 "k8s.io/api/core/v1"
)

// imageCache keeps the apt state and the downloaded packages of
// TestImage, per Debian release, across runs.
const imageCache = "/var/cache/proxykit/image"

// imagePath is the PATH of Debian's images (the daemon looks its programs
// up there).
const imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// dockerfile is what TestImage reads of the Dockerfile.
type dockerfile struct {
	builder  string   // the image of the build stage, e.g. golang:1.26-trixie
	base     string   // the image of the final stage, e.g. debian:trixie-slim
	packages []string // apt-get install's packages in the final stage
	goEnv    []string // the go build command's environment, e.g. CGO_ENABLED=0
	goArgs   []string // its arguments after "go"
	copySrc  string   // COPY --from=<build stage>: the binary in the stage
	copyDst  string   // and where it goes in the image
	entry    []string // ENTRYPOINT
}

// parseDockerfile reads the instructions TestImage follows; it knows the
// forms the Dockerfile uses and fails on others.
func parseDockerfile(data string) (*dockerfile, error) {
	var df dockerfile
	var stage string
	joined := strings.ReplaceAll(data, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		f := strings.Fields(rest)
		for len(f) > 0 && strings.HasPrefix(f[0], "--") && !strings.HasPrefix(f[0], "--from=") {
			f = f[1:] // --platform=..., --mount=...
		}
		switch strings.ToUpper(instr) {
		case "FROM":
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				stage = f[2]
				df.builder = f[0]
			} else if len(f) == 1 {
				stage = ""
				df.base = f[0]
			} else {
				return nil, fmt.Errorf("FROM %s", rest)
			}
		case "RUN":
			cmd := strings.Join(f, " ")
			for _, part := range strings.Split(cmd, "&&") {
				w := strings.Fields(part)
				switch i := indexSeq(w, "go", "build"); {
				case i >= 0 && stage != "":
					df.goEnv, df.goArgs = w[:i], w[i+1:]
				}
				if i := indexSeq(w, "apt-get", "install"); i >= 0 && stage == "" {
					for _, p := range w[i+2:] {
						if !strings.HasPrefix(p, "-") {
							df.packages = append(df.packages, p)
						}
					}
				}
			}
		case "COPY":
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") && stage == "" {
				df.copySrc, df.copyDst = f[1], f[2]
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &df.entry); err != nil {
				return nil, fmt.Errorf("ENTRYPOINT %s: %v (want the exec form)", rest, err)
			}
		}
	}
	switch {
	case df.builder == "" || df.base == "":
		return nil, fmt.Errorf("want a build stage and a final stage, got %q and %q", df.builder, df.base)
	case len(df.packages) == 0:
		return nil, fmt.Errorf("no apt-get install in the final stage")
	case df.goArgs == nil:
		return nil, fmt.Errorf("no go build in the build stage")
	case df.copyDst == "" || len(df.entry) == 0:
		return nil, fmt.Errorf("no COPY --from of the binary or no ENTRYPOINT")
	}
	return &df, nil
}

// indexSeq returns where the words seq start in w, or -1.
func indexSeq(w []string, seq ...string) int {
	for i := 0; i+len(seq) <= len(w); i++ {
		if slices.Equal(w[i:i+len(seq)], seq) {
			return i
		}
	}
	return -1
}

// TestImage builds the file system of examples/proxy/Dockerfile's image
// without a container runtime and runs, chrooted in it, the programs each
// mode needs and the daemon. It follows the Dockerfile: the final
// stage's Debian release gives the archive, its apt-get install list the
// packages (downloaded with their dependencies by apt from that release,
// whatever the host runs, and unpacked with dpkg-deb), its go build line
// the daemon, built here the same way and copied where COPY puts it.
// Maintainer scripts do not run: the plain iptables name (an alternative
// Debian's postinst points at iptables-nft) is absent, and the daemon
// does not use it. Downloads are cached in /var/cache/proxykit/image.
func TestImage(t *testing.T) {
	sandbox.RequirePrivilege(t)
	for _, tool := range []string{"apt-get", "dpkg-deb", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (Debian's) is needed to build the image's file system: %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df, err := parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	if df.entry[0] != df.copyDst {
		t.Errorf("ENTRYPOINT %q does not run the daemon COPY puts at %s", df.entry, df.copyDst)
	}
	checkBuilderGo(t, df.builder)

	m := regexp.MustCompile(`^debian:([a-z]+)-slim$`).FindStringSubmatch(df.base)
	if m == nil {
		t.Fatalf("final stage FROM %s: want debian:<release>-slim", df.base)
	}
	root := t.TempDir()
	// Debian's images have merged /usr.
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.MkdirAll(filepath.Join(root, "usr", d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("usr/"+d, filepath.Join(root, d)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	debs := downloadPackages(ctx, t, m[1], df.packages)
	for _, deb := range debs {
		unpackDeb(ctx, t, deb, root)
	}
	t.Logf("%d packages of %s for %v, unpacked in %v", len(debs), m[1], df.packages, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	bin := buildDaemon(ctx, t, df, filepath.Join(root, df.copyDst))
	t.Logf("%s built in %v", df.copyDst, time.Since(start).Round(time.Millisecond))
	checkStatic(t, bin)
	// The eBPF backend's programs are embedded: the image needs no file.
	for _, obj := range []string{"sock_bpfel.o", "destroy_bpfel.o"} {
		want, err := os.ReadFile(filepath.Join("..", "..", "backends", "ebpf", obj))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(bin); !bytes.Contains(got, want) {
			t.Errorf("the daemon does not embed backends/ebpf/%s", obj)
		}
	}

	// What each mode runs, by the name the daemon looks up, and a word
	// the program's --version prints.
	type program struct{ name, version string }
	var iptables []program
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, fl := range []struct{ name, version string }{{"nft", "(nf_tables)"}, {"legacy", "(legacy)"}} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				iptables = append(iptables, program{fam + "-" + fl.name + suffix, fl.version})
			}
		}
	}
	modes := []struct {
		mode     string
		programs []program
	}{
		// nf_tables through netlink; nft to inspect what it programmed.
		{"nftables", []program{{"nft", "nftables"}}},
		// Both flavours: the backend picks the one the node uses, as
		// kube-proxy's iptables-wrapper does.
		{"iptables", iptables},
		// modprobe ip_vs; the auxiliary rules are nf_tables (netlink).
		{"ipvs", []program{{"modprobe", "kmod"}, {"nft", "nftables"}}},
		// Embedded programs, nf_tables for traffic from outside.
		{"ebpf", []program{{"nft", "nftables"}}},
		// For operators (kube-proxy's image has it); the daemon
		// clears conntrack entries through netlink.
		{"conntrack", []program{{"conntrack", "conntrack"}}},
	}
	for _, md := range modes {
		t.Run(md.mode, func(t *testing.T) {
			for _, p := range md.programs {
				out, err := chrootRun(ctx, root, p.name, "--version")
				if err != nil {
					t.Errorf("%s --version in the image: %v\n%s", p.name, err, out)
					continue
				}
				if !strings.Contains(out, p.version) {
					t.Errorf("%s --version: %q lacks %q", p.name, out, p.version)
				}
			}
		})
	}
	// The daemon runs in the image and takes the DaemonSet's arguments
	// and the ConfigMap's configuration, mounted where the DaemonSet
	// mounts it: --write-config-to decodes, checks and writes it out.
	objs := readDeploy(t)
	pod := objs.daemonSets[0].Spec.Template.Spec
	c := pod.Containers[0]
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Volumes, func(v v1.Volume) bool { return v.Name == m.Name })
		if i < 0 || pod.Volumes[i].ConfigMap == nil || pod.Volumes[i].ConfigMap.Name != objs.configMaps[0].Name {
			continue
		}
		for k, v := range objs.configMaps[0].Data {
			if err := os.MkdirAll(filepath.Join(root, m.MountPath), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, m.MountPath, k), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range append(df.entry[1:], c.Args...) {
		args = append(args, strings.ReplaceAll(a, "$(NODE_NAME)", "node-1"))
	}
	args = append(args, "--write-config-to=/tmp/config.out")
	out, err := chrootRun(ctx, root, df.entry[0], args...)
	if err != nil {
		t.Fatalf("%s %q in the image: %v\n%s", df.entry[0], args, err, out)
	}
	written, err := os.ReadFile(filepath.Join(root, "tmp", "config.out"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nmode: nftables\n", "\nhostnameOverride: node-1\n"} {
		if !strings.Contains("\n"+string(written), want) {
			t.Errorf("the configuration the daemon read lacks %q:\n%s", strings.TrimSpace(want), written)
		}
	}
}

// checkBuilderGo checks that the build stage's Go (golang:1.N...) is at
// least the go directive of go.mod.
func checkBuilderGo(t *testing.T, builder string) {
	t.Helper()
	m := regexp.MustCompile(`^golang:1\.(\d+)`).FindStringSubmatch(builder)
	if m == nil {
		t.Errorf("build stage FROM %s: want golang:1.N", builder)
		return
	}
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go 1\.(\d+)`).FindSubmatch(mod)
	if want == nil {
		t.Fatal("go.mod has no go directive")
	}
	have, _ := strconv.Atoi(m[1])
	need, _ := strconv.Atoi(string(want[1]))
	if have < need {
		t.Errorf("the build stage's Go 1.%d is older than go.mod's 1.%d", have, need)
	}
}

// aptRun runs apt-get on a state of its own below dir: the sources of
// release, an empty dpkg status (nothing installed, so install resolves
// every dependency), the package cache in dir/archives.
func aptRun(ctx context.Context, dir string, args ...string) (string, error) {
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + filepath.Join(dir, "sources.list"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(dir, "sources.list.d"),
		"-o", "Dir::State=" + filepath.Join(dir, "state"),
		"-o", "Dir::State::status=" + filepath.Join(dir, "state", "status"),
		"-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "Dir::Cache::archives=" + filepath.Join(dir, "archives"),
		"-o", "APT::Architecture=" + runtime.GOARCH,
		"-o", "APT::Install-Recommends=false",
		"-o", "Debug::NoLocking=true",
	}
	cmd := exec.CommandContext(ctx, "apt-get", append(opts, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// downloadPackages downloads pkgs and their dependencies from Debian
// release into the cache and returns the .deb files.
func downloadPackages(ctx context.Context, t *testing.T, release string, pkgs []string) []string {
	t.Helper()
	dir := filepath.Join(imageCache, release+"-"+runtime.GOARCH)
	for _, d := range []string{"sources.list.d", "state/lists/partial", "cache", "archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	var sources strings.Builder
	for _, s := range []struct{ uri, suite string }{
		{"http://deb.debian.org/debian", release},
		{"http://deb.debian.org/debian", release + "-updates"},
		{"http://deb.debian.org/debian-security", release + "-security"},
	} {
		fmt.Fprintf(&sources, "deb [signed-by=%s] %s %s main\n", keyring, s.uri, s.suite)
	}
	for name, content := range map[string]string{"sources.list": sources.String(), "state/status": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The indexes are refreshed once a day; a failed refresh with older
	// indexes at hand goes on with them (the packages may be cached too).
	stamp := filepath.Join(dir, "updated")
	if st, stampErr := os.Stat(stamp); stampErr != nil || time.Since(st.ModTime()) > 24*time.Hour {
		out, err := aptRun(ctx, dir, "update")
		switch {
		case err == nil:
			if err := os.WriteFile(stamp, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		case stampErr != nil:
			t.Fatalf("apt-get update (Debian %s, %s): %v\n%s", release, keyring, err, out)
		default:
			t.Logf("apt-get update failed, using the indexes of %s: %v\n%s", dir, err, out)
		}
	}
	// What apt would install on an empty system, then the download of
	// those of them not cached yet.
	out, err := aptRun(ctx, dir, append([]string{"-s", "install"}, pkgs...)...)
	if err != nil {
		t.Fatalf("apt-get -s install %v: %v\n%s", pkgs, err, out)
	}
	var debs []string
	inst := regexp.MustCompile(`(?m)^Inst (\S+) \((\S+) .*\[(\S+)\]\)`)
	for _, m := range inst.FindAllStringSubmatch(out, -1) {
		version := strings.ReplaceAll(m[2], ":", "%3a")
		debs = append(debs, filepath.Join(dir, "archives", m[1]+"_"+version+"_"+m[3]+".deb"))
	}
	if len(debs) == 0 {
		t.Fatalf("apt-get -s install %v installs nothing:\n%s", pkgs, out)
	}
	if out, err := aptRun(ctx, dir, append([]string{"-y", "-q", "install", "--download-only"}, pkgs...)...); err != nil {
		t.Fatalf("apt-get install --download-only %v: %v\n%s", pkgs, err, out)
	}
	// Versions no longer in the archive go.
	aptRun(ctx, dir, "autoclean")
	for _, d := range debs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("apt downloaded no %s: %v", filepath.Base(d), err)
		}
	}
	return debs
}

// unpackDeb extracts a package's files into root as dpkg would, keeping
// root's /bin, /lib... symlinks into /usr.
func unpackDeb(ctx context.Context, t *testing.T, deb, root string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "sh", "-c", `dpkg-deb --fsys-tarfile "$1" | tar -x -C "$2" --keep-directory-symlink`, "sh", deb, root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", filepath.Base(deb), err, out)
	}
}

// buildDaemon runs the Dockerfile's go build for this machine's
// architecture, with the output at dst.
func buildDaemon(ctx context.Context, t *testing.T, df *dockerfile, dst string) string {
	t.Helper()
	vars := map[string]string{"TARGETOS": "linux", "TARGETARCH": runtime.GOARCH}
	env := os.Environ()
	for _, e := range df.goEnv {
		if !strings.Contains(e, "=") {
			t.Fatalf("go build line: %q before go is not an assignment", e)
		}
		env = append(env, os.Expand(e, func(k string) string { return vars[k] }))
	}
	args := append([]string(nil), df.goArgs...)
	found := false
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			if args[i+1] != df.copySrc {
				t.Errorf("go build writes %s, COPY takes %s", args[i+1], df.copySrc)
			}
			args[i+1], found = dst, true
		}
	}
	if !found {
		t.Fatalf("go build %q: no -o", args)
	}
	if err := os.MkdirAll(path.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join("..", "..") // the build context: the repository root
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %q: %v\n%s", args, err, out)
	}
	return dst
}

// checkStatic checks that the daemon needs no library of the image.
func checkStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the daemon is dynamically linked (CGO_ENABLED=0 expected)")
		}
	}
}

// chrootRun runs name, looked up in the image's PATH, chrooted in root
// (so with the image's loader and libraries), and returns its output.
func chrootRun(ctx context.Context, root, name string, args ...string) (string, error) {
	prog := name
	if !strings.HasPrefix(name, "/") {
		prog = ""
		for _, dir := range strings.Split(imagePath, ":") {
			if p := path.Join(dir, name); isExecutableIn(root, p) {
				prog = p
				break
			}
		}
		if prog == "" {
			return "", fmt.Errorf("%s is not in the image's PATH", name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	// exec resolves prog in the chroot.
	cmd.Path = prog
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + imagePath, "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// isExecutableIn reports whether p, with its symbolic links resolved in
// root (not on the host), is an executable file of root.
func isExecutableIn(root, p string) bool {
	for range 40 {
		st, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			return false
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return st.Mode().IsRegular() && st.Mode()&0o111 != 0
		}
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return false
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = target
	}
	return false
}
