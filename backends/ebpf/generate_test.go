package ebpf

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/proxykit/proxykit/internal/testnet"
)

// TestGeneratedObjectsUpToDate rebuilds the BPF objects with the
// go:generate commands of gen.go into a temporary directory and checks
// that the committed Go files are byte-for-byte the same and the
// committed objects hold the same programs and maps. Objects are compared
// by content, not bytes: clang-19 orders the BTF string table differently
// depending on the directory it builds in, so a clone at another path
// builds an object that differs in bytes but not in meaning.
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
		if bytes.Equal(got, want) {
			continue
		}
		if strings.HasSuffix(f, ".o") {
			if diff := objectDiff(got, want); diff != "" {
				t.Errorf("committed %s differs from what bpf/*.c builds (%s); run go generate ./backends/ebpf/...", filepath.Base(f), diff)
			} else {
				t.Logf("committed %s differs in bytes only (BTF layout), not in programs or maps", filepath.Base(f))
			}
			continue
		}
		t.Errorf("committed %s differs from what bpf/*.c builds; run go generate ./backends/ebpf/...", filepath.Base(f))
	}
}

// objectDiff compares two BPF ELF objects by what a loader sees: every
// program's type, attach type, section, license and instructions (with
// their source lines and references), and every map's definition and key
// and value types. It returns "" if they agree and else names the first
// difference.
func objectDiff(got, want []byte) string {
	a, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(got))
	if err != nil {
		return fmt.Sprintf("committed object does not load: %v", err)
	}
	b, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(want))
	if err != nil {
		return fmt.Sprintf("built object does not load: %v", err)
	}
	if len(a.Programs) != len(b.Programs) || len(a.Maps) != len(b.Maps) {
		return fmt.Sprintf("%d programs and %d maps, want %d and %d", len(a.Programs), len(a.Maps), len(b.Programs), len(b.Maps))
	}
	for name, pb := range b.Programs {
		pa, ok := a.Programs[name]
		if !ok {
			return "program " + name + " missing"
		}
		da := fmt.Sprintf("%v %v %s %s\n%v", pa.Type, pa.AttachType, pa.SectionName, pa.License, pa.Instructions)
		db := fmt.Sprintf("%v %v %s %s\n%v", pb.Type, pb.AttachType, pb.SectionName, pb.License, pb.Instructions)
		if da != db {
			return "program " + name
		}
	}
	for name, mb := range b.Maps {
		ma, ok := a.Maps[name]
		if !ok {
			return "map " + name + " missing"
		}
		da := fmt.Sprintf("%v %d %d %d %d %v %v %v", ma.Type, ma.KeySize, ma.ValueSize, ma.MaxEntries, ma.Flags, ma.Pinning, ma.Key, ma.Value)
		db := fmt.Sprintf("%v %d %d %d %d %v %v %v", mb.Type, mb.KeySize, mb.ValueSize, mb.MaxEntries, mb.Flags, mb.Pinning, mb.Key, mb.Value)
		if da != db {
			return "map " + name
		}
	}
	return ""
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
