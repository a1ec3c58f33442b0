package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// Flavour is the kernel interface a set of iptables programs writes.
type Flavour string

// The flavours.
const (
	// Legacy programs the x_tables blobs (ip_tables, ip6_tables).
	Legacy Flavour = "legacy"
	// NFT programs nf_tables through nft_compat (iptables-nft).
	NFT Flavour = "nft"
)

// Tools are the absolute paths of the programs of one IP family and
// flavour.
type Tools struct {
	Family  model.IPFamily
	Flavour Flavour
	// Cmd is iptables or ip6tables, Save and Restore their -save and
	// -restore.
	Cmd, Save, Restore string
}

// MissingError says a program is not installed.
type MissingError struct {
	// Program is the name looked up, e.g. "ip6tables-nft-restore".
	Program string
	// Err is the lookup's error.
	Err error
}

func (e *MissingError) Error() string {
	return "program " + e.Program + " not found: " + e.Err.Error()
}

// Unwrap returns the lookup's error.
func (e *MissingError) Unwrap() error { return e.Err }

func baseName(f model.IPFamily) string {
	if f == model.IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// FindTools resolves the programs of family f and flavour fl: the
// flavoured names (iptables-nft, iptables-nft-save, ...) or, when a
// system ships only the plain names, those if their --version reports
// the flavour. The error of a missing program is a [*MissingError] naming
// the first one absent.
func FindTools(f model.IPFamily, fl Flavour) (Tools, error) {
	base := baseName(f)
	t := Tools{Family: f, Flavour: fl}
	var firstMissing error
	for _, x := range []struct {
		dst  *string
		name string
	}{{&t.Restore, base + "-" + string(fl) + "-restore"}, {&t.Save, base + "-" + string(fl) + "-save"}, {&t.Cmd, base + "-" + string(fl)}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			if firstMissing == nil {
				firstMissing = &MissingError{Program: x.name, Err: err}
			}
			continue
		}
		*x.dst = p
	}
	if firstMissing == nil {
		return t, nil
	}
	// Older systems (iptables < 1.8) have only the plain names.
	plain := Tools{Family: f, Flavour: fl}
	for _, x := range []struct {
		dst  *string
		name string
	}{{&plain.Restore, base + "-restore"}, {&plain.Save, base + "-save"}, {&plain.Cmd, base}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			return Tools{}, firstMissing
		}
		*x.dst = p
	}
	if v, err := versionOf(context.Background(), plain.Cmd); err != nil || v.Flavour != fl {
		return Tools{}, firstMissing
	}
	return plain, nil
}

// Version is a program's version, as its --version prints it.
type Version struct {
	Major, Minor, Patch int
	Flavour             Flavour
}

func (v Version) String() string {
	return fmt.Sprintf("v%d.%d.%d (%s)", v.Major, v.Minor, v.Patch, v.Flavour)
}

// AtLeast reports whether v is major.minor.patch or later.
func (v Version) AtLeast(major, minor, patch int) bool {
	if v.Major != major {
		return v.Major > major
	}
	if v.Minor != minor {
		return v.Minor > minor
	}
	return v.Patch >= patch
}

var versionRE = regexp.MustCompile(`v(\d+)\.(\d+)(?:\.(\d+))?(?:\s+\(([^)]+)\))?`)

// ParseVersion parses the output of iptables --version, e.g. "iptables
// v1.8.9 (nf_tables)". A version without a flavour (iptables < 1.8) is
// legacy.
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("no version in %q", strings.TrimSpace(s))
	}
	v := Version{Flavour: Legacy}
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	if m[4] == "nf_tables" {
		v.Flavour = NFT
	}
	return v, nil
}

// versionOf runs prog --version. It reads nothing from the kernel, so it
// may run in any namespace.
func versionOf(ctx context.Context, prog string) (Version, error) {
	out, err := exec.CommandContext(ctx, prog, "--version").CombinedOutput()
	if err != nil {
		return Version{}, fmt.Errorf("%s --version: %w: %s", prog, err, bytes.TrimSpace(out))
	}
	return ParseVersion(string(out))
}

// DefaultWait is how long a Runner waits for the xtables lock.
const DefaultWait = 5 * time.Second

// Runner runs one family's and flavour's programs in a network namespace.
// Its methods may be called from one goroutine at a time.
type Runner struct {
	ns      *netns.NS
	tools   Tools
	version Version
	wait    []string
}

// NewRunner returns a Runner of t in ns, which it does not own (the
// caller closes it after the Runner's last use). It runs t.Cmd --version
// and fails if the program is missing or reports another flavour. wait is
// how long to wait for the xtables lock; zero means [DefaultWait].
func NewRunner(ctx context.Context, ns *netns.NS, t Tools, wait time.Duration) (*Runner, error) {
	if wait <= 0 {
		wait = DefaultWait
	}
	v, err := versionOf(ctx, t.Cmd)
	if err != nil {
		return nil, err
	}
	if v.Flavour != t.Flavour {
		return nil, fmt.Errorf("%s is %s, not %s", t.Cmd, v.Flavour, t.Flavour)
	}
	secs := max(1, int((wait+time.Second-1)/time.Second))
	r := &Runner{ns: ns, tools: t, version: v, wait: []string{"-w", strconv.Itoa(secs)}}
	if t.Flavour == Legacy && !v.AtLeast(1, 8, 8) {
		// Poll the lock every 100 ms instead of every second. (The nft
		// flavour takes no lock; from 1.8.8 on the legacy one waits on
		// the lock without polling and only warns about -W, on
		// standard error, which a failure's message would start with.)
		r.wait = append(r.wait, "-W", "100000")
	}
	return r, nil
}

// Tools returns the runner's programs.
func (r *Runner) Tools() Tools { return r.tools }

// Version returns the version of the runner's programs.
func (r *Runner) Version() Version { return r.version }

// HasRandomFully reports whether MASQUERADE takes --random-fully
// (iptables 1.6.2).
func (r *Runner) HasRandomFully() bool { return r.version.AtLeast(1, 6, 2) }

// execResult is what a program run returned.
type execResult struct {
	stdout   []byte
	stderr   string
	exitCode int
}

// run runs prog in the runner's namespace with stdin (nil: none). err is
// set when the program could not be run or ctx ended; a non-zero exit is
// reported in exitCode only.
func (r *Runner) run(ctx context.Context, stdin []byte, prog string, args ...string) (execResult, error) {
	return r.runIn(ctx, false, stdin, prog, args...)
}

// runIn is run; with isolated the program runs in a new, empty network
// namespace of its own instead of the runner's.
func (r *Runner) runIn(ctx context.Context, isolated bool, stdin []byte, prog string, args ...string) (execResult, error) {
	var stdout, stderr bytes.Buffer
	var res execResult
	err := r.ns.Do(func() error {
		cmd := exec.CommandContext(ctx, prog, args...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		if isolated {
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		}
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		// The child is forked from this thread, which is in the
		// namespace, so it runs there.
		err := cmd.Run()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) && ctx.Err() == nil {
			res.exitCode = exitErr.ExitCode()
			return nil
		}
		return err
	})
	res.stdout, res.stderr = stdout.Bytes(), strings.TrimSpace(stderr.String())
	if cerr := ctx.Err(); cerr != nil {
		// Killed because ctx ended: say so rather than "signal: killed".
		return res, fmt.Errorf("%s: %w", filepath.Base(prog), cerr)
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w", filepath.Base(prog), err)
	}
	return res, nil
}

// Save returns the output of *-save for table, or for every table the
// kernel holds when table is empty. (Naming a legacy table that does not
// exist yet makes the kernel create it in the namespace; listing all does
// not.)
func (r *Runner) Save(ctx context.Context, table string) ([]byte, error) {
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	res, err := r.run(ctx, nil, r.tools.Save, args...)
	if err != nil {
		return nil, err
	}
	if res.exitCode != 0 {
		return nil, fmt.Errorf("%s %s: exit status %d: %s", filepath.Base(r.tools.Save), strings.Join(args, " "), res.exitCode, res.stderr)
	}
	return res.stdout, nil
}

// Command runs the iptables command with args (after -w). A non-zero exit
// is an error carrying the program's standard error.
func (r *Runner) Command(ctx context.Context, args ...string) (string, error) {
	res, err := r.run(ctx, nil, r.tools.Cmd, append(r.wait[:len(r.wait):len(r.wait)], args...)...)
	if err != nil {
		return "", err
	}
	if res.exitCode != 0 {
		return "", &CommandError{Program: filepath.Base(r.tools.Cmd), Args: args, ExitCode: res.exitCode, Stderr: res.stderr}
	}
	return string(res.stdout), nil
}

// Check reports whether rule (the arguments after the chain name) is in
// chain of table (iptables -C). A missing rule is false, not an error.
func (r *Runner) Check(ctx context.Context, table, chain string, rule ...string) (bool, error) {
	args := append([]string{"-t", table, "-C", chain}, rule...)
	_, err := r.Command(ctx, args...)
	var ce *CommandError
	if errors.As(err, &ce) && ce.ExitCode == 1 {
		return false, nil
	}
	return err == nil, err
}

// CommandError is a non-zero exit of the iptables command.
type CommandError struct {
	Program  string
	Args     []string
	ExitCode int
	Stderr   string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s %s: exit status %d: %s", e.Program, strings.Join(e.Args, " "), e.ExitCode, e.Stderr)
}

// Restore feeds input to *-restore --noflush. On failure the error is a
// [*RestoreError]; the tables committed before the failing line stay
// committed.
func (r *Runner) Restore(ctx context.Context, input []byte) error {
	args := append(r.wait[:len(r.wait):len(r.wait)], "--noflush")
	res, err := r.run(ctx, input, r.tools.Restore, args...)
	if err != nil {
		return err
	}
	if res.exitCode == 0 {
		return nil
	}
	return newRestoreError(filepath.Base(r.tools.Restore), input, res.stderr, res.exitCode)
}

// Test parses input with *-restore --test --noflush, which loads every
// extension the input uses but commits nothing. It runs in a new, empty
// network namespace: the program reads each table it names before it
// parses (the legacy flavour the whole table, 1.6 s at 30,000 services),
// and what it tests, the extensions and the kernel's support for them,
// is the same in every namespace. Where a namespace cannot be created
// (no CAP_SYS_ADMIN) it runs in the runner's.
func (r *Runner) Test(ctx context.Context, input []byte) error {
	args := append(r.wait[:len(r.wait):len(r.wait)], "--noflush", "--test")
	res, err := r.runIn(ctx, true, input, r.tools.Restore, args...)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
		res, err = r.run(ctx, input, r.tools.Restore, args...)
	}
	if err != nil {
		return err
	}
	if res.exitCode == 0 {
		return nil
	}
	return newRestoreError(filepath.Base(r.tools.Restore), input, res.stderr, res.exitCode)
}
