package iptables

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// RestoreError is a failed *-restore run.
type RestoreError struct {
	// Program is the program's name, e.g. "iptables-nft-restore".
	Program string
	// Line is the 1-based input line the program reported, or 0 when it
	// named none. A rule the kernel refuses is reported at its own line
	// by the nft flavour, at its table's COMMIT line by the legacy one.
	Line int
	// Text is the input's line Line, without its newline.
	Text string
	// Msg is the program's message, condensed to one line.
	Msg string
	// ExitCode is the program's exit status.
	ExitCode int
	// Input is the whole input, printed only by %+v.
	Input []byte
}

// Error names the program, the failing line and the program's message.
func (e *RestoreError) Error() string {
	var b strings.Builder
	b.WriteString(e.Program)
	if e.Line > 0 {
		fmt.Fprintf(&b, ": line %d (%s)", e.Line, e.Text)
	}
	b.WriteString(": ")
	if e.Msg != "" {
		b.WriteString(e.Msg)
	} else {
		fmt.Fprintf(&b, "exit status %d", e.ExitCode)
	}
	return b.String()
}

// Format prints Error for %v and %s, and adds the numbered input for %+v.
func (e *RestoreError) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('+'):
		fmt.Fprintf(f, "%s\ninput:\n", e.Error())
		for i, l := range strings.SplitAfter(string(e.Input), "\n") {
			if l != "" {
				fmt.Fprintf(f, "%6d  %s", i+1, l)
			}
		}
	case verb == 'q':
		fmt.Fprintf(f, "%q", e.Error())
	default:
		fmt.Fprint(f, e.Error())
	}
}

// lineRE matches the line numbers both flavours print: "Error occurred at
// line: 4", "line 4 failed", "line 4: RULE_APPEND failed".
var lineRE = regexp.MustCompile(`\bline:? (\d+)`)

// lineNoiseRE matches how the programs say which line failed: "Error
// occurred at line: 4", "line 4: ", "line 4 failed: ".
var lineNoiseRE = regexp.MustCompile(`^(?:Error occurred at line: \d+|line \d+(?: failed)?:?)`)

// progPrefixRE matches "iptables-restore v1.8.9 (legacy): " and
// "iptables-nft-restore: ".
var progPrefixRE = regexp.MustCompile(`^ip6?tables[-\w]*(?: v[\d.]+(?: \([^)]*\))?)?:\s*`)

func newRestoreError(prog string, input []byte, stderr string, code int) *RestoreError {
	e := &RestoreError{Program: prog, ExitCode: code, Input: input}
	var msg []string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "Try `") {
			continue
		}
		// The program prefixes its name (and version); keep the rest,
		// without the line number, which Line holds.
		l = strings.TrimSpace(progPrefixRE.ReplaceAllString(l, ""))
		l = strings.TrimSpace(lineNoiseRE.ReplaceAllString(l, ""))
		if l != "" {
			msg = append(msg, l)
		}
	}
	e.Msg = strings.Join(msg, "; ")
	if e.Msg == "" {
		e.Msg = "failed"
	}
	if m := lineRE.FindStringSubmatch(stderr); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
			e.Line = n
			e.Text = lineOf(input, n)
		}
	}
	return e
}

// lineOf returns the 1-based line n of input, or "".
func lineOf(input []byte, n int) string {
	for i := 1; len(input) > 0; i++ {
		l, rest, _ := bytes.Cut(input, []byte("\n"))
		if i == n {
			return string(l)
		}
		input = rest
	}
	return ""
}
