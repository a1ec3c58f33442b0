package vmtest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultKernelMeta is the Debian metapackage whose dependency names the
// kernel the VM boots: on Debian 12 (bookworm) a 6.1 kernel.
const DefaultKernelMeta = "linux-image-amd64"

// Kernel is a Debian kernel unpacked in the cache: its image and a module
// tree that busybox depmod has indexed.
type Kernel struct {
	// Package is the Debian package, e.g. linux-image-6.1.0-56-amd64.
	Package string
	// Version is the package version, e.g. 6.1.192-2.
	Version string
	// Release is the kernel release (uname -r), e.g. 6.1.0-56-amd64.
	Release string
	// Dir is the root of the unpacked tree (boot/, lib/modules/).
	Dir string
}

// Image returns the path of the kernel image.
func (k *Kernel) Image() string { return filepath.Join(k.Dir, "boot", "vmlinuz-"+k.Release) }

// ModulesDir returns the module directory, lib/modules/RELEASE.
func (k *Kernel) ModulesDir() string { return filepath.Join(k.Dir, "lib", "modules", k.Release) }

// KernelOptions say which kernel to fetch and where to keep it.
type KernelOptions struct {
	// CacheDir holds unpacked kernels, one directory per package version.
	CacheDir string
	// Meta is the metapackage whose dependency is the kernel package;
	// empty means [DefaultKernelMeta]. Ignored when Package is set.
	Meta string
	// Package is the exact kernel package; empty means Meta's dependency.
	Package string
	// Fresh downloads and unpacks the kernel even when it is cached.
	Fresh bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// completeMark marks a fully unpacked kernel directory.
const completeMark = ".complete"

// moduleDirs are the parts of the module tree kept in the cache: the
// network stack and what it depends on, the 9p and virtio drivers that
// read results back, and the dummy and veth drivers.
var moduleDirs = []string{
	"kernel/net/",
	"kernel/lib/",
	"kernel/crypto/",
	"kernel/arch/x86/crypto/",
	"kernel/fs/9p/",
	"kernel/fs/netfs/",
	"kernel/fs/fscache/",
	"kernel/drivers/virtio/",
	"kernel/drivers/net/dummy.ko",
	"kernel/drivers/net/veth.ko",
	"kernel/drivers/char/hw_random/",
}

// FetchKernel returns the kernel named by opts, downloading it with
// `apt-get download` and unpacking the image and the needed modules with
// `dpkg-deb --fsys-tarfile` unless the cache holds it. The package is
// never installed. When apt cannot name the package (no package lists,
// no network) the newest cached kernel is used, unless opts.Fresh is set.
func FetchKernel(ctx context.Context, opts KernelOptions) (*Kernel, error) {
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	if opts.CacheDir == "" {
		return nil, errors.New("vmtest: no cache directory")
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	pkg, version, err := resolveKernelPackage(ctx, opts)
	if err != nil {
		if opts.Fresh {
			return nil, err
		}
		k, cerr := newestCached(opts.CacheDir)
		if cerr != nil {
			return nil, fmt.Errorf("%w (and nothing usable is cached: %v)", err, cerr)
		}
		fmt.Fprintf(logw, "vmtest: %v; using the cached %s %s\n", err, k.Package, k.Version)
		return k, nil
	}
	dir := filepath.Join(opts.CacheDir, pkg+"_"+version)
	if !opts.Fresh {
		if k, err := loadCached(dir); err == nil {
			return k, nil
		}
	}
	fmt.Fprintf(logw, "vmtest: fetching %s %s into %s\n", pkg, version, opts.CacheDir)
	tmp, err := os.MkdirTemp(opts.CacheDir, ".fetch-")
	if err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	defer os.RemoveAll(tmp)
	// apt drops privileges to _apt for downloads; let it write here.
	os.Chmod(tmp, 0o777)
	if out, err := command(ctx, tmp, "apt-get", "download", "-q", pkg+"="+version); err != nil {
		return nil, fmt.Errorf("vmtest: apt-get download %s=%s: %w\n%s", pkg, version, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("vmtest: apt-get download %s left %d .deb files", pkg, len(debs))
	}
	root := filepath.Join(tmp, "root")
	release, err := unpackKernel(ctx, debs[0], root)
	if err != nil {
		return nil, err
	}
	if out, err := command(ctx, "", "busybox", "depmod", "-b", root, release); err != nil {
		return nil, fmt.Errorf("vmtest: busybox depmod: %w\n%s", err, out)
	}
	meta := fmt.Sprintf("package=%s\nversion=%s\nrelease=%s\n", pkg, version, release)
	if err := os.WriteFile(filepath.Join(root, completeMark), []byte(meta), 0o644); err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	if err := os.Rename(root, dir); err != nil {
		return nil, fmt.Errorf("vmtest: %w", err)
	}
	return loadCached(dir)
}

// resolveKernelPackage names the kernel package and its candidate
// version, running apt-get update once if apt knows nothing yet.
func resolveKernelPackage(ctx context.Context, opts KernelOptions) (pkg, version string, err error) {
	resolve := func() (string, string, error) {
		pkg, version := opts.Package, ""
		if pkg == "" {
			// The metapackage pins the exact version: one apt call.
			meta := cmp.Or(opts.Meta, DefaultKernelMeta)
			out, err := command(ctx, "", "apt-cache", "show", "--no-all-versions", meta)
			if err != nil {
				return "", "", fmt.Errorf("vmtest: apt-cache show %s: %w", meta, err)
			}
			if pkg, version = kernelDependency(controlField(out, "Depends")); pkg == "" {
				return "", "", fmt.Errorf("vmtest: %s depends on no linux-image package", meta)
			}
		}
		if version == "" {
			out, err := command(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
			if err != nil {
				return "", "", fmt.Errorf("vmtest: apt-cache show %s: %w", pkg, err)
			}
			if version = controlField(out, "Version"); version == "" {
				return "", "", fmt.Errorf("vmtest: apt knows no version of %s", pkg)
			}
		}
		return pkg, version, nil
	}
	pkg, version, err = resolve()
	if err == nil || os.Geteuid() != 0 {
		return pkg, version, err
	}
	if _, uerr := command(ctx, "", "apt-get", "update", "-qq"); uerr != nil {
		return "", "", err
	}
	return resolve()
}

// kernelDependency returns the first linux-image-* package of a Depends
// field, and its version when pinned with "(= VERSION)".
func kernelDependency(depends string) (pkg, version string) {
	for _, alt := range strings.FieldsFunc(depends, func(r rune) bool { return r == ',' || r == '|' }) {
		f := strings.Fields(alt)
		if len(f) == 0 || !strings.HasPrefix(f[0], "linux-image-") {
			continue
		}
		if len(f) == 3 && f[1] == "(=" {
			version = strings.TrimSuffix(f[2], ")")
		}
		return f[0], version
	}
	return "", ""
}

// controlField returns a field of a Debian control stanza.
func controlField(stanza, name string) string {
	for _, l := range strings.Split(stanza, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func loadCached(dir string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, completeMark))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Dir: dir}
	for _, l := range strings.Split(string(b), "\n") {
		key, v, _ := strings.Cut(l, "=")
		switch key {
		case "package":
			k.Package = v
		case "version":
			k.Version = v
		case "release":
			k.Release = v
		}
	}
	if k.Release == "" {
		return nil, fmt.Errorf("%s: incomplete", dir)
	}
	if _, err := os.Stat(k.Image()); err != nil {
		return nil, err
	}
	return k, nil
}

// newestCached returns the most recently unpacked kernel of the cache.
func newestCached(cache string) (*Kernel, error) {
	ents, err := os.ReadDir(cache)
	if err != nil {
		return nil, err
	}
	var best *Kernel
	var bestTime int64
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(cache, e.Name())
		k, err := loadCached(dir)
		if err != nil {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, completeMark))
		if err == nil && (best == nil || st.ModTime().UnixNano() > bestTime) {
			best, bestTime = k, st.ModTime().UnixNano()
		}
	}
	if best == nil {
		return nil, errors.New("no kernel in " + cache)
	}
	return best, nil
}

// unpackKernel extracts the kernel image and the module directories
// [moduleDirs] of a linux-image .deb into root and returns the kernel
// release.
func unpackKernel(ctx context.Context, deb, root string) (string, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("vmtest: dpkg-deb: %w", err)
	}
	release, terr := extractKernelTar(bufio.NewReaderSize(stdout, 1<<20), root)
	io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	if terr != nil {
		return "", terr
	}
	if werr != nil {
		return "", fmt.Errorf("vmtest: dpkg-deb --fsys-tarfile %s: %w\n%s", deb, werr, stderr.String())
	}
	if release == "" {
		return "", fmt.Errorf("vmtest: %s holds no boot/vmlinuz-*", deb)
	}
	return release, nil
}

// extractKernelTar writes the wanted members of a kernel package's data
// archive below root and returns the kernel release.
func extractKernelTar(r io.Reader, root string) (string, error) {
	tr := tar.NewReader(r)
	var release string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return release, nil
		}
		if err != nil {
			return "", fmt.Errorf("vmtest: read kernel package: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if h.Typeflag != tar.TypeReg || !wantKernelFile(name) {
			continue
		}
		if r, ok := strings.CutPrefix(name, "boot/vmlinuz-"); ok {
			release = r
		}
		dst := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", fmt.Errorf("vmtest: extract %s: %w", name, err)
		}
	}
}

// wantKernelFile reports whether a path of the kernel package belongs in
// the cache.
func wantKernelFile(name string) bool {
	if strings.HasPrefix(name, "boot/vmlinuz-") {
		return true
	}
	rest, ok := strings.CutPrefix(name, "lib/modules/")
	if !ok {
		return false
	}
	_, rel, ok := strings.Cut(rest, "/")
	if !ok {
		return false
	}
	if strings.HasPrefix(rel, "modules.order") || strings.HasPrefix(rel, "modules.builtin") {
		return true
	}
	return slices.ContainsFunc(moduleDirs, func(p string) bool {
		if strings.HasSuffix(p, "/") {
			return strings.HasPrefix(rel, p)
		}
		return rel == p
	})
}

// command runs a program and returns its combined output.
func command(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
