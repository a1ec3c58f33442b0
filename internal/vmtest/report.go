package vmtest

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// event is a go test -json event (cmd/test2json).
type event struct {
	Time    *time.Time `json:",omitempty"`
	Action  string
	Package string   `json:",omitempty"`
	Test    string   `json:",omitempty"`
	Elapsed *float64 `json:",omitempty"`
	Output  string   `json:",omitempty"`
}

// reporter prints results the way go test does: in text, the output of
// failed (and, unlike go test, skipped) tests and one line per package, or
// every line with verbose; or go test -json events.
type reporter struct {
	w       io.Writer
	verbose bool
	json    bool
	res     *Result

	// per package, reset by start
	pkg     string
	lines   map[string][]string // test -> buffered output
	elapsed time.Duration
	status  map[string]string // test -> pass/fail/skip
	partial map[string]string // test -> incomplete last line
}

func newReporter(w io.Writer, verbose, json bool, res *Result) *reporter {
	return &reporter{w: w, verbose: verbose, json: json, res: res}
}

func (r *reporter) start(pkg string) {
	r.pkg, r.lines, r.status, r.partial, r.elapsed = pkg, map[string][]string{}, map[string]string{}, map[string]string{}, 0
}

func (r *reporter) emit(ev event) {
	if ev.Package == "" {
		ev.Package = r.pkg
	}
	now := time.Now()
	ev.Time = &now
	b, _ := json.Marshal(ev)
	fmt.Fprintf(r.w, "%s\n", b)
}

// noTests reports a package without test files.
func (r *reporter) noTests(pkg string) {
	r.res.Packages = append(r.res.Packages, &PackageResult{Package: pkg, Status: "?"})
	if r.json {
		r.start(pkg)
		r.emit(event{Action: "output", Output: "?   \t" + pkg + "\t[no test files]\n"})
		r.emit(event{Action: "skip"})
		return
	}
	fmt.Fprintf(r.w, "?   \t%s\t[no test files]\n", pkg)
}

// buildFailed reports a package whose test binary did not build.
func (r *reporter) buildFailed(pkg, out string) {
	r.res.Packages = append(r.res.Packages, &PackageResult{Package: pkg, Status: "FAIL", Reason: "build failed"})
	r.start(pkg)
	if r.json {
		r.emit(event{Action: "output", Output: out})
		r.emit(event{Action: "fail"})
		return
	}
	fmt.Fprintf(r.w, "%sFAIL\t%s [build failed]\n", out, pkg)
}

// line handles one event of the package being followed.
func (r *reporter) line(raw []byte) {
	var ev event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return
	}
	if r.json {
		r.w.Write(append(raw, '\n'))
	}
	switch ev.Action {
	case "output":
		// test2json passes on partial lines (a benchmark's name before
		// its result); join them.
		if !strings.HasSuffix(ev.Output, "\n") {
			r.partial[ev.Test] += ev.Output
			return
		}
		ev.Output = r.partial[ev.Test] + ev.Output
		delete(r.partial, ev.Test)
		if !r.json && (r.verbose || isBenchLine(ev.Output)) {
			// go test prints benchmark results without -v too.
			fmt.Fprint(r.w, ev.Output)
		}
		r.lines[ev.Test] = append(r.lines[ev.Test], ev.Output)
	case "pass", "fail", "skip":
		if ev.Test == "" {
			if ev.Elapsed != nil {
				r.elapsed = time.Duration(*ev.Elapsed * float64(time.Second))
			}
			return
		}
		r.status[ev.Test] = ev.Action
		switch ev.Action {
		case "pass":
			r.res.Passed++
		case "fail":
			r.res.Failed++
		case "skip":
			r.res.Skipped++
		}
		if !r.verbose && !r.json && ev.Action != "pass" {
			r.printLines(r.lines[ev.Test])
		}
		delete(r.lines, ev.Test)
	}
}

// isBenchLine reports whether a line is a benchmark result or the header
// go test prints before them.
func isBenchLine(l string) bool {
	for _, p := range []string{"goos: ", "goarch: ", "pkg: ", "cpu: "} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return strings.HasPrefix(l, "Benchmark") && strings.Contains(l, "\t") && strings.Contains(l, "/op")
}

func (r *reporter) printLines(lines []string) {
	for _, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "=== ") {
			continue
		}
		fmt.Fprint(r.w, l)
	}
}

// follow reads the output of one test binary while the VM writes it
// (base.out, then base.rc when the binary exits), converts it with go
// tool test2json and reports it. It returns when the binary has exited,
// or when the VM has.
func (r *reporter) follow(ctx context.Context, j testJob, base string, exited <-chan struct{}) {
	r.start(j.Package)
	pr := &PackageResult{Package: j.Package}
	r.res.Packages = append(r.res.Packages, pr)
	started := time.Now()

	conv := exec.CommandContext(ctx, "go", "tool", "test2json", "-t", "-p", j.Package)
	stdin, err1 := conv.StdinPipe()
	stdout, err2 := conv.StdoutPipe()
	var convErr error
	if err1 != nil || err2 != nil {
		convErr = fmt.Errorf("pipes: %v %v", err1, err2)
	} else if err := conv.Start(); err != nil {
		convErr = err
	}
	done := make(chan struct{})
	if convErr == nil {
		go func() {
			defer close(done)
			s := bufio.NewScanner(stdout)
			s.Buffer(make([]byte, 64<<10), 16<<20)
			for s.Scan() {
				r.line(s.Bytes())
			}
			io.Copy(io.Discard, stdout)
		}()
	} else {
		close(done)
		stdin = nopWriteCloser{io.Discard}
	}

	ran := tailFile(base+".out", base+".rc", exited, stdin)
	stdin.Close()
	<-done
	if convErr == nil {
		conv.Wait()
	}

	rc, elapsed := readStatus(base + ".rc")
	pr.Elapsed = cmp.Or(elapsed, r.elapsed, time.Since(started))
	switch {
	case convErr != nil:
		pr.Status, pr.Reason = "FAIL", "go tool test2json: "+convErr.Error()
	case !ran:
		pr.Status, pr.Reason = "FAIL", "did not run: the VM ended first"
	case rc < 0:
		pr.Status, pr.Reason = "FAIL", "did not finish: the VM ended or timed out"
	case rc != 0:
		pr.Status = "FAIL"
	default:
		pr.Status = "ok"
	}
	if pr.Status == "FAIL" && !r.verbose && !r.json {
		r.printLines(r.lines[""])
		r.printUnfinished()
	}
	r.finish(pr)
}

// maxUnfinishedLines bounds the output printed per unfinished test.
const maxUnfinishedLines = 200

// printUnfinished prints the output of the tests that started but never
// ended (a hung test, or the tests a timeout's panic names), whose lines
// are otherwise printed only when a test ends: the last
// maxUnfinishedLines of each.
func (r *reporter) printUnfinished() {
	for _, name := range slices.Sorted(maps.Keys(r.lines)) {
		lines := r.lines[name]
		if name == "" || r.status[name] != "" || len(lines) == 0 {
			continue
		}
		fmt.Fprintf(r.w, "vmtest: %s did not finish; its last output:\n", name)
		r.printLines(lines[max(0, len(lines)-maxUnfinishedLines):])
	}
}

// finish prints the package line.
func (r *reporter) finish(pr *PackageResult) {
	secs := fmt.Sprintf("%.3fs", pr.Elapsed.Seconds())
	if r.json {
		if pr.Reason != "" {
			r.emit(event{Action: "output", Output: "vmtest: " + pr.Reason + "\n"})
			r.emit(event{Action: "fail"})
		}
		return
	}
	switch {
	case pr.Status == "ok":
		fmt.Fprintf(r.w, "ok  \t%s\t%s\n", pr.Package, secs)
	case pr.Reason != "":
		fmt.Fprintf(r.w, "FAIL\t%s\t%s [%s]\n", pr.Package, secs, pr.Reason)
	default:
		fmt.Fprintf(r.w, "FAIL\t%s\t%s\n", pr.Package, secs)
	}
}

// summary prints go test's closing FAIL line when something failed, and
// a count of tests.
func (r *reporter) summary() {
	if r.json {
		return
	}
	if !r.res.OK() && len(r.res.Packages) > 0 {
		fmt.Fprintln(r.w, "FAIL")
	}
	fmt.Fprintf(r.w, "vmtest: %d passed, %d failed, %d skipped\n", r.res.Passed, r.res.Failed, r.res.Skipped)
}

// readStatus reads a binary's exit status and run time; -1 when it did
// not finish.
func readStatus(path string) (int, time.Duration) {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1, 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1, 0
	}
	rc, err := strconv.Atoi(f[0])
	if err != nil {
		return -1, 0
	}
	var d time.Duration
	if len(f) > 1 {
		if s, err := strconv.ParseFloat(f[1], 64); err == nil {
			d = time.Duration(s * float64(time.Second))
		}
	}
	return rc, d
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// tailFile copies the growing file out to w until the file marked
// finished exists and out is read to its end, or the VM has exited. It
// reports whether out ever appeared.
func tailFile(out, finished string, exited <-chan struct{}, w io.Writer) bool {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		if f == nil {
			f, _ = os.Open(out)
		}
		if f != nil {
			for {
				n, err := f.Read(buf)
				if n > 0 {
					w.Write(buf[:n])
				}
				if err != nil || n == 0 {
					break
				}
			}
		}
		// Check the end marks after draining, so nothing written
		// before them is lost.
		if _, err := os.Stat(finished); err == nil && f != nil {
			drain(f, w, buf)
			return true
		}
		select {
		case <-exited:
			if f == nil {
				f, _ = os.Open(out)
			}
			if f != nil {
				drain(f, w, buf)
			}
			return f != nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func drain(f *os.File, w io.Writer, buf []byte) {
	for {
		n, err := f.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
		}
		if err != nil || n == 0 {
			return
		}
	}
}
