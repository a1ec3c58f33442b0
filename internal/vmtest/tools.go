package vmtest

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// HostTools are the host's programs copied into the VM, with the shared
// libraries they load, because tests run them: the conformance suite
// inspects and decorates the node namespace with ip, nft, iptables and
// ip6tables, and dumps conntrack on failure. They are Debian's own
// binaries (dynamically linked against glibc), so the VM runs exactly what
// a Debian 12 node runs. Missing ones are left out with a warning.
var HostTools = []string{
	"ip", "nft", "conntrack",
	"iptables", "iptables-save", "iptables-restore",
	"ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore",
	"ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore",
	"ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore",
	"ipvsadm", // optional: not installed by hack/vmtest.sh, handy with -v when present
}

// optionalTools are left out without a warning when missing.
var optionalTools = []string{"ipvsadm"}

// hostFiles are configuration files the tools read, copied when present.
var hostFiles = []string{"/etc/protocols", "/etc/services", "/etc/ethertypes", "/etc/iproute2/rt_tables"}

// xtablesDirs hold the iptables extensions, which iptables loads with
// dlopen (so ldd does not list them).
var xtablesDirs = []string{"/usr/lib/x86_64-linux-gnu/xtables", "/usr/lib/xtables", "/usr/lib64/xtables"}

// toolPath is where the VM finds the tools.
const toolPath = "/usr/sbin"

// addBusybox adds a statically linked busybox as /bin/busybox.
func (a *archive) addBusybox() error {
	p, err := lookPath("busybox")
	if err != nil {
		return fmt.Errorf("vmtest: busybox not found (install busybox-static): %w", err)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return err
	}
	static, err := isStatic(real)
	if err != nil {
		return err
	}
	if !static {
		return fmt.Errorf("vmtest: %s is dynamically linked; install busybox-static", real)
	}
	return a.addFile("bin/busybox", real)
}

// isStatic reports whether an ELF executable needs no dynamic loader.
func isStatic(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// addHostTools adds the host programs named in tools, their libraries and
// the iptables extensions. It returns the names it could not find.
func (a *archive) addHostTools(ctx context.Context, tools []string) (missing []string, err error) {
	var bins []string
	for _, name := range tools {
		p, err := lookPath(name)
		if err != nil {
			if !slices.Contains(optionalTools, name) {
				missing = append(missing, name)
			}
			continue
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, err
		}
		if err := a.addFile(real, real); err != nil {
			return nil, err
		}
		if dst := filepath.Join(toolPath, name); dst != real {
			a.addSymlink(dst, real)
		}
		bins = append(bins, real)
	}
	for _, dir := range xtablesDirs {
		exts, _ := filepath.Glob(filepath.Join(dir, "*.so"))
		for _, ext := range exts {
			if err := a.addFile(ext, ext); err != nil {
				return nil, err
			}
			bins = append(bins, ext)
		}
	}
	if err := a.addLibs(bins); err != nil {
		return nil, err
	}
	for _, f := range hostFiles {
		if _, err := os.Stat(f); err == nil {
			if err := a.addFile(f, f); err != nil {
				return nil, err
			}
		}
	}
	return missing, nil
}

// libDirs are where the dynamic loader looks for libraries by default
// (Debian's multiarch directories first).
var libDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// addLibs adds the dynamic loader and the shared libraries that bins
// need, transitively, at the paths the loader finds them (with the
// content of the files they resolve to). It reads the ELF headers itself:
// running ldd on the hundred iptables extensions takes many seconds.
func (a *archive) addLibs(bins []string) error {
	queue := append([]string{}, bins...)
	seen := map[string]bool{}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		interp, needed, err := elfDeps(p)
		if err != nil {
			return fmt.Errorf("vmtest: %s: %w", p, err)
		}
		if interp != "" && !a.has(interp) {
			if err := a.addFile(interp, interp); err != nil {
				return err
			}
		}
		for _, lib := range needed {
			found := findLib(lib)
			if found == "" {
				return fmt.Errorf("vmtest: %s needs %s, which is not in %s", p, lib, strings.Join(libDirs, ", "))
			}
			if !a.has(found) {
				if err := a.addFile(found, found); err != nil {
					return err
				}
			}
			queue = append(queue, found)
		}
	}
	return nil
}

// elfDeps returns the interpreter and the DT_NEEDED libraries of an ELF
// file.
func elfDeps(p string) (interp string, needed []string, err error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return "", nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return "", nil, err
	}
	return interp, needed, nil
}

// findLib returns the path the dynamic loader finds a library at.
func findLib(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// lookPath finds a program in PATH or in the sbin directories, which a
// non-root PATH often lacks.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", name)
}
