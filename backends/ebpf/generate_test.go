package ebpf

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestGeneratedObjectsUpToDate rebuilds the BPF objects with the
// go:generate commands of gen.go into a temporary directory and checks
// that the committed objects and Go files are byte-for-byte the same.
// It needs clang-19 and llvm-strip-19.
func TestGeneratedObjectsUpToDate(t *testing.T) {
	testnet.RequireCommand(t, "clang-19")
	testnet.RequireCommand(t, "llvm-strip-19")
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	n := 0
	for _, l := range strings.Split(string(src), "\n") {
		cmdline, ok := strings.CutPrefix(l, "//go:generate ")
		if !ok {
			continue
		}
		args, err := splitQuoted(cmdline)
		if err != nil {
			t.Fatal(err)
		}
		n++
		// go tool bpf2go [flags] IDENT SOURCE: the output directory
		// goes before the positional arguments.
		args = append(args[:len(args)-2:len(args)-2], "-output-dir", out, args[len(args)-2], args[len(args)-1])
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "GOPACKAGE=ebpf", "GOFILE=gen.go")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmdline, err, b)
		}
	}
	if n == 0 {
		t.Fatal("no go:generate line in gen.go")
	}
	files, err := filepath.Glob(filepath.Join(out, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("nothing generated: %v", err)
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Base(f))
		if err != nil {
			t.Errorf("generated %s is not committed: %v", filepath.Base(f), err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("committed %s differs from what bpf/*.c builds; run go generate ./backends/ebpf/...", filepath.Base(f))
		}
	}
}

// splitQuoted splits a go:generate line into words; double quotes group.
func splitQuoted(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case r == ' ' && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, os.ErrInvalid
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
