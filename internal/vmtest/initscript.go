package vmtest

import (
	"fmt"
	"strings"
	"time"
)

// testJob is one test binary run in the VM.
type testJob struct {
	// Package is the import path.
	Package string
	// Binary is the file name of the test binary in the share's bin/.
	Binary string
	// Dir is the package directory: the test's working directory (the
	// module is mounted read-only at its host path).
	Dir string
	// Out is the base name of the output files in the share's out/:
	// Out.out (the binary's -test.v=test2json output) and Out.rc (its
	// exit status).
	Out string
}

// initConfig is what the VM's init script does.
type initConfig struct {
	BootModules []string
	Modules     []string
	ModuleDir   string // in the VM, e.g. /lib/modules/6.1.0-56-amd64
	SrcDir      string // host path of the module, mounted read-only
	Jobs        []testJob
	TestArgs    []string
	TestTimeout time.Duration
	Env         []string // KEY=VALUE
}

// Mount tags of the 9p shares and where the VM mounts them.
const (
	shareTag   = "pkshare"
	shareMount = "/pk"
	srcTag     = "pksrc"
)

// initScript renders /init: a busybox shell script that mounts the
// pseudo file systems, loads modules, mounts the shares, runs every test
// binary with its output and exit status written to the share, and powers
// off. Lines starting with "vmtest:" go to the console for the host to
// show.
func initScript(c initConfig) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("#!/bin/busybox sh")
	w("/bin/busybox mkdir -p /bin /sbin /proc /sys /dev /tmp /run /var")
	w("/bin/busybox --install -s /bin")
	w("export PATH=%s:/usr/bin:/bin:/sbin", toolPath)
	w("mount -t proc proc /proc")
	w("mount -t sysfs sysfs /sys")
	w("mount -t devtmpfs devtmpfs /dev 2>/dev/null")
	w("mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm")
	w("mount -t tmpfs -o mode=1777 tmpfs /tmp")
	w("mount -t tmpfs -o mode=755 tmpfs /run")
	w("ln -sfn /run /var/run")
	w("mkdir -p /run/netns /run/xtables")
	w("mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null")
	w("mount -t bpf bpf /sys/fs/bpf 2>/dev/null")
	w("mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null")
	w("echo /bin/modprobe > /proc/sys/kernel/modprobe")
	w("hostname vmtest")
	w("ip link set lo up 2>/dev/null || /bin/ip link set lo up")
	w("echo \"vmtest: booted $(uname -r) in $(cut -d' ' -f1 /proc/uptime)s\"")
	// One modprobe for all modules (each process costs much under
	// emulation); then name the ones that are neither loaded nor built in.
	w("load() { modprobe -a \"$@\" 2>/dev/null; for m in \"$@\"; do [ -e /sys/module/$m ] || echo \"vmtest: module $m is not available\"; done; }")
	w("load %s", strings.Join(c.BootModules, " "))
	w("load %s", strings.Join(c.Modules, " "))
	w("echo \"vmtest: modules loaded at $(cut -d' ' -f1 /proc/uptime)s ($(wc -l < /proc/modules) modules)\"")
	w("cut -d' ' -f1 /proc/modules | sort >/tmp/modules.boot")
	w("mkdir -p %s && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none %s %s || { echo 'vmtest: cannot mount the share'; poweroff -f; }", shareMount, shareTag, shareMount)
	if c.SrcDir != "" {
		w("mkdir -p %s && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro %s %s || echo 'vmtest: cannot mount the source tree'", shQuote(c.SrcDir), srcTag, shQuote(c.SrcDir))
	}
	// A heartbeat on the console (not "vmtest:" lines, so only the
	// console log and its tail after a failure show them): whether the
	// VM still ran and how much memory it had left, every minute. Once a
	// test binary has run 15 s past its timeout (its own panic should
	// have ended it), the kernel lists the blocked tasks (sysrq w) for
	// the tail to show, before the VM's own limit (a minute after).
	w("( i=0; while sleep 15; do i=$((i+1)); now=$(cut -d. -f1 /proc/uptime); "+
		"[ $((i %% 4)) -eq 0 ] && echo \"heartbeat: ${now}s, $(grep MemAvailable /proc/meminfo | tr -s ' '), load $(cut -d' ' -f1-3 /proc/loadavg)\"; "+
		"if [ -f /tmp/binary-start ] && [ $((now - $(cat /tmp/binary-start))) -gt %d ]; then echo \"heartbeat: a test binary ran past its timeout; blocked tasks:\"; echo w > /proc/sysrq-trigger; rm -f /tmp/binary-start; fi; done ) &",
		int(c.TestTimeout.Seconds())+15)
	w("export HOME=/tmp TMPDIR=/tmp GOTRACEBACK=all")
	for _, kv := range c.Env {
		w("export %s", shQuote(kv))
	}
	args := []string{"-test.v=test2json", "-test.paniconexit0", fmt.Sprintf("-test.timeout=%s", c.TestTimeout)}
	for _, a := range c.TestArgs {
		args = append(args, shQuote(a))
	}
	for _, j := range c.Jobs {
		out := shareMount + "/out/" + j.Out
		w("echo \"vmtest: run %s at $(cut -d' ' -f1 /proc/uptime)s\"", j.Package)
		w("mkdir -p %s/out", shareMount)
		w("if [ -d %s ]; then cd %s; else mkdir -p /tmp/%s && cd /tmp/%s; fi", shQuote(j.Dir), shQuote(j.Dir), j.Out, j.Out)
		w("t0=$(cut -d' ' -f1 /proc/uptime)")
		w("cut -d. -f1 /proc/uptime >/tmp/binary-start")
		w("%s/bin/%s %s >%s.out 2>&1", shareMount, j.Binary, strings.Join(args, " "), out)
		// exit status and run time in seconds
		w("echo $? $(awk -v t0=$t0 '{print $1-t0}' /proc/uptime) >%s.rc.tmp && mv %s.rc.tmp %s.rc", out, out, out)
		w("cd /")
	}
	w("echo \"vmtest: done at $(cut -d' ' -f1 /proc/uptime)s\"")
	// Modules the kernel loaded on demand: candidates for DefaultModules.
	w("m=$(cut -d' ' -f1 /proc/modules | grep -vxF -f /tmp/modules.boot | tr '\\n' ' ')")
	w("[ -z \"$m\" ] || echo \"vmtest: modules loaded during the tests: $m\"")
	w("sync")
	w("umount %s 2>/dev/null", shareMount)
	w("poweroff -f")
	return b.String()
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
