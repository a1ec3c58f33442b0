package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/proxykit/proxykit/internal/vmtest"
)

func main() {
	os.Exit(run())
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func run() int {
	var opts vmtest.Options
	var env, modules listFlag
	fs := flag.NewFlagSet("vmtest", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vmtest [flags] PACKAGES... [-- TEST FLAGS...]\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.Kernel.CacheDir, "cache", defaultCache(), "kernel cache directory")
	fs.BoolVar(&opts.Kernel.Fresh, "fresh", false, "download and unpack the kernel even if it is cached")
	fs.StringVar(&opts.Kernel.Package, "kernel-package", "", "Debian kernel package (default: the dependency of -kernel-meta)")
	fs.StringVar(&opts.Kernel.Meta, "kernel-meta", vmtest.DefaultKernelMeta, "Debian kernel metapackage")
	fs.DurationVar(&opts.Timeout, "timeout", 15*time.Minute, "bound of the whole VM run")
	fs.IntVar(&opts.MemoryMiB, "mem", 1024, "VM memory in MiB")
	fs.IntVar(&opts.CPUs, "smp", 2, "virtual CPUs")
	fs.BoolVar(&opts.Verbose, "v", false, "print every test output line and the VM console")
	fs.BoolVar(&opts.JSON, "json", false, "print go test -json events")
	fs.StringVar(&opts.WorkDir, "work", "", "keep the run's files (binaries, initramfs, console.log, outputs) in this directory")
	fs.Var(&env, "env", "KEY=VALUE exported to the tests (repeatable)")
	fs.Var(&modules, "module", "extra kernel module to load (repeatable)")
	args := os.Args[1:]
	var testArgs []string
	for i, a := range args {
		if a == "--" {
			args, testArgs = args[:i], args[i+1:]
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts.Packages = fs.Args()
	if len(opts.Packages) == 0 {
		fs.Usage()
		return 2
	}
	opts.TestArgs = testArgs
	opts.Env = env
	opts.Modules = modules

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := vmtest.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if !res.OK() {
		return 1
	}
	return 0
}

// defaultCache is where kernels are kept between runs.
func defaultCache() string {
	if d := os.Getenv("PROXYKIT_VMTEST_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "proxykit-vmtest")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		return filepath.Join(h, ".cache", "proxykit-vmtest")
	}
	return "/var/cache/proxykit-vmtest"
}
