package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a run. Packages and CacheDir are required.
type Options struct {
	// Packages are go package patterns (./backends/ipvs/, ./...).
	Packages []string
	// TestArgs are passed to every test binary. go test's short flags
	// (-run X, -count=1) are accepted and rewritten to -test.run X.
	TestArgs []string
	// Dir is the directory go commands run in (the module); empty
	// means the current directory.
	Dir string
	// Kernel selects and caches the kernel; see [KernelOptions].
	Kernel KernelOptions
	// Timeout bounds the whole VM run (boot to power-off); the test
	// binaries get it minus a minute. Zero means 15 minutes.
	Timeout time.Duration
	// MemoryMiB is the VM's memory; zero means 1024.
	MemoryMiB int
	// CPUs is the number of virtual CPUs; zero means 2 (multi-threaded
	// TCG runs one host thread per vCPU).
	CPUs int
	// Modules are loaded in addition to [DefaultModules].
	Modules []string
	// Env holds KEY=VALUE pairs exported to the tests, after the
	// defaults (PROXYKIT_REQUIRE_PRIVILEGED=1, PROXYKIT_REQUIRE_IPVS=1).
	Env []string
	// Verbose prints every line of test output (go test -v) and the
	// VM's console.
	Verbose bool
	// JSON prints go test -json events instead of text.
	JSON bool
	// WorkDir, when set, is where the run's files (binaries, initramfs,
	// console log, outputs) are kept; empty means a temporary
	// directory removed at the end.
	WorkDir string
	// Stdout receives test results; Stderr progress and diagnostics.
	// Nil means os.Stdout and os.Stderr.
	Stdout, Stderr io.Writer
}

// Result is the outcome of a run.
type Result struct {
	Packages []*PackageResult
	// Passed, Failed and Skipped count tests and subtests.
	Passed, Failed, Skipped int
	// Build, Boot and Total are the time spent building and packing,
	// booting the VM up to the first test, and the whole run.
	Build, Boot, Total time.Duration
}

// OK reports whether every package passed.
func (r *Result) OK() bool {
	for _, p := range r.Packages {
		if !p.OK() {
			return false
		}
	}
	return len(r.Packages) > 0
}

// PackageResult is the outcome of one package.
type PackageResult struct {
	Package string
	// Status is "ok", "FAIL" or "?" (no test files).
	Status string
	// Elapsed is the test binary's run time in the VM.
	Elapsed time.Duration
	// Reason says why a package failed without a test failing (did not
	// build, did not run, crashed, timed out).
	Reason string
}

// OK reports whether the package passed or had no tests.
func (p *PackageResult) OK() bool { return p.Status != "FAIL" }

// pkgInfo is what go list says of a package.
type pkgInfo struct {
	ImportPath, Dir, Name string
	HasTests              bool
}

// Run builds the test binaries of opts.Packages statically, packs an
// initramfs with busybox, the modules and the host tools, boots the
// cached Debian kernel under qemu (software emulation) and reports the
// results as go test does. The error is about the run itself (build,
// kernel, qemu); test failures are in the Result.
func Run(ctx context.Context, opts Options) (*Result, error) {
	start := time.Now()
	stdout, stderr := opts.Stdout, opts.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 15 * time.Minute
	}
	if opts.MemoryMiB <= 0 {
		opts.MemoryMiB = 1024
	}
	if opts.CPUs <= 0 {
		opts.CPUs = 2
	}
	if opts.Kernel.Log == nil {
		opts.Kernel.Log = stderr
	}
	work := opts.WorkDir
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "vmtest-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(work)
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"share/bin", "share/out"} {
		os.RemoveAll(filepath.Join(work, d))
		if err := os.MkdirAll(filepath.Join(work, d), 0o777); err != nil {
			return nil, err
		}
	}

	k, err := FetchKernel(ctx, opts.Kernel)
	if err != nil {
		return nil, err
	}
	modDir, pkgs, err := listPackages(ctx, opts.Dir, opts.Packages)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	rep := newReporter(stdout, opts.Verbose, opts.JSON, res)
	var jobs []testJob
	for i, p := range pkgs {
		if !p.HasTests {
			rep.noTests(p.ImportPath)
			continue
		}
		bin := fmt.Sprintf("%02d-%s.test", i, p.Name)
		if out, err := buildTest(ctx, opts.Dir, p.ImportPath, filepath.Join(work, "share", "bin", bin)); err != nil {
			rep.buildFailed(p.ImportPath, out)
			continue
		}
		jobs = append(jobs, testJob{Package: p.ImportPath, Binary: bin, Dir: p.Dir, Out: fmt.Sprintf("%02d", i)})
	}
	if len(jobs) == 0 {
		res.Total = time.Since(start)
		rep.summary()
		return res, nil
	}

	initrd := filepath.Join(work, "initramfs.cpio")
	testTimeout := max(opts.Timeout-time.Minute, opts.Timeout/2)
	env := append([]string{"PROXYKIT_REQUIRE_PRIVILEGED=1", "PROXYKIT_REQUIRE_IPVS=1"}, opts.Env...)
	if err := packInitramfs(ctx, initrd, k, initConfig{
		BootModules: BootModules,
		Modules:     append(append([]string{}, DefaultModules...), opts.Modules...),
		ModuleDir:   "/lib/modules/" + k.Release,
		SrcDir:      modDir,
		Jobs:        jobs,
		TestArgs:    testBinaryArgs(opts.TestArgs),
		TestTimeout: testTimeout,
		Env:         env,
	}, stderr); err != nil {
		return nil, err
	}
	res.Build = time.Since(start)
	fmt.Fprintf(stderr, "vmtest: built %d test binaries and the initramfs in %v; booting %s (%s) under qemu (TCG, %d vCPU, %d MiB), timeout %v\n",
		len(jobs), res.Build.Round(100*time.Millisecond), k.Package, k.Version, opts.CPUs, opts.MemoryMiB, opts.Timeout)

	vmCtx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	share := filepath.Join(work, "share")
	console, err := os.Create(filepath.Join(work, "console.log"))
	if err != nil {
		return nil, err
	}
	defer console.Close()
	bootStart := time.Now()
	var firstRun sync.Once
	conW := &lineWriter{fn: func(line string) {
		if opts.Verbose {
			fmt.Fprintln(stderr, "console: "+line)
		} else if strings.HasPrefix(line, "vmtest:") {
			fmt.Fprintln(stderr, line)
		}
		if strings.HasPrefix(line, "vmtest: run ") {
			firstRun.Do(func() { res.Boot = time.Since(bootStart) })
		}
	}}
	cmd := qemuCommand(vmCtx, k, initrd, share, modDir, opts)
	cmd.Stdout = io.MultiWriter(console, conW)
	cmd.Stderr = io.MultiWriter(console, conW)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vmtest: start qemu (install qemu-system-x86): %w", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	for _, j := range jobs {
		rep.follow(ctx, j, filepath.Join(share, "out", j.Out), exited)
	}
	<-exited
	conW.Flush()
	res.Total = time.Since(start)
	var problem string
	switch {
	case vmCtx.Err() == context.DeadlineExceeded:
		problem = fmt.Sprintf("the VM did not finish within %v and was killed", opts.Timeout)
	case waitErr != nil:
		problem = fmt.Sprintf("qemu: %v", waitErr)
	}
	if problem != "" || !res.OK() {
		if problem != "" {
			fmt.Fprintf(stderr, "vmtest: %s\n", problem)
		}
		fmt.Fprintf(stderr, "vmtest: last lines of the console (%s):\n%s", filepath.Join(work, "console.log"), tail(filepath.Join(work, "console.log"), 80))
	}
	fmt.Fprintf(stderr, "vmtest: build+pack %v, boot %v, whole run %v\n",
		res.Build.Round(100*time.Millisecond), res.Boot.Round(100*time.Millisecond), res.Total.Round(100*time.Millisecond))
	rep.summary()
	return res, nil
}

// listPackages runs go list on patterns and returns the module directory
// and the packages.
func listPackages(ctx context.Context, dir string, patterns []string) (string, []pkgInfo, error) {
	if len(patterns) == 0 {
		return "", nil, errors.New("vmtest: no packages")
	}
	modOut, err := goCmd(ctx, dir, nil, "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return "", nil, fmt.Errorf("vmtest: go list -m: %w\n%s", err, modOut)
	}
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{.Name}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}"}, patterns...)
	out, err := goCmd(ctx, dir, nil, args...)
	if err != nil {
		return "", nil, fmt.Errorf("vmtest: go list: %w\n%s", err, out)
	}
	var pkgs []pkgInfo
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 5 {
			continue
		}
		pkgs = append(pkgs, pkgInfo{ImportPath: f[0], Dir: f[1], Name: f[2], HasTests: f[3] != "0" || f[4] != "0"})
	}
	return strings.TrimSpace(modOut), pkgs, nil
}

// buildTest builds a static test binary.
func buildTest(ctx context.Context, dir, pkg, out string) (string, error) {
	return goCmd(ctx, dir, []string{"CGO_ENABLED=0"}, "test", "-c", "-o", out, pkg)
}

func goCmd(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// testBinaryArgs rewrites go test's flags (-run X, -count=1) to the test
// binary's (-test.run X); other arguments pass unchanged.
func testBinaryArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "-test.") && !strings.HasPrefix(a, "--") {
			a = "-test." + strings.TrimPrefix(a, "-")
		}
		out = append(out, a)
	}
	return out
}

// packInitramfs writes the initramfs: busybox, /init, the modules and
// the host tools.
func packInitramfs(ctx context.Context, dst string, k *Kernel, c initConfig, logw io.Writer) error {
	a := newArchive()
	if err := a.addBusybox(); err != nil {
		return err
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "etc", "root"} {
		a.addDir(d, 0o755)
	}
	a.addBytes("init", []byte(initScript(c)), 0o755)
	a.addBytes("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	a.addBytes("etc/group", []byte("root:x:0:\n"), 0o644)
	missing, err := a.addHostTools(ctx, HostTools)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		fmt.Fprintf(logw, "vmtest: host tools not found, left out of the VM: %s\n", strings.Join(missing, " "))
	}
	idx, err := loadModuleIndex(k.ModulesDir())
	if err != nil {
		return fmt.Errorf("vmtest: %w", err)
	}
	paths, unknown := idx.closure(append(append([]string{}, c.BootModules...), c.Modules...), autoloadDirs)
	_ = unknown // built into the kernel or absent; the VM reports them
	for _, p := range paths {
		if err := a.addFile(filepath.Join(c.ModuleDir, p), filepath.Join(k.ModulesDir(), p)); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(k.ModulesDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "modules.") {
			if err := a.addFile(filepath.Join(c.ModuleDir, e.Name()), filepath.Join(k.ModulesDir(), e.Name())); err != nil {
				return err
			}
		}
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if err := a.write(f); err != nil {
		f.Close()
		return fmt.Errorf("vmtest: write initramfs: %w", err)
	}
	return f.Close()
}

// qemuCommand returns the qemu command line of a run.
func qemuCommand(ctx context.Context, k *Kernel, initrd, share, src string, opts Options) *exec.Cmd {
	args := []string{
		"-accel", "tcg,thread=multi",
		"-cpu", "max",
		"-smp", strconv.Itoa(opts.CPUs),
		"-m", strconv.Itoa(opts.MemoryMiB),
		"-nographic", "-no-reboot",
		"-nic", "none",
		"-kernel", k.Image(),
		"-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 oops=panic edd=off loglevel=4 mitigations=off random.trust_cpu=on " +
			// Expedited RCU grace periods: network namespace teardown
			// waits for many, which under emulation otherwise piles up
			// and stalls whatever needs the same locks (hook
			// registration) for tens of seconds.
			"rcupdate.rcu_expedited=1 rdinit=/init",
		"-virtfs", "local,path=" + share + ",mount_tag=" + shareTag + ",security_model=none,id=" + shareTag,
		"-device", "virtio-rng-pci",
	}
	if src != "" {
		args = append(args, "-virtfs", "local,path="+src+",mount_tag="+srcTag+",security_model=none,readonly=on,id="+srcTag)
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.Stdin = nil
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// lineWriter calls fn for every complete line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.fn(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Flush passes on an incomplete last line.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.fn(strings.TrimRight(string(w.buf), "\r"))
		w.buf = nil
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error() + "\n"
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		lines = append(lines, strings.TrimRight(s.Text(), "\r"))
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}
