package static

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

// Log lines that say what a load did with the cache.
const (
	logHit      = "read the decoded documents from the cache"
	logOther    = "the cache holds another content"
	logUnusable = "cannot use the cache file"
)

// cacheManifest is manifest with every kind the cache file distinguishes:
// objects decoded at once, a List, an ignored kind, an empty document,
// a Node and ServiceCIDRs (repeated).
const cacheManifest = manifest + `
---
apiVersion: v1
kind: Node
metadata: {name: node1, labels: {a: b}}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: c1}
spec: {cidrs: [10.96.0.0/16, "fd00:10:96::/112"]}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDRList
items:
- apiVersion: networking.k8s.io/v1
  kind: ServiceCIDR
  metadata: {name: c2}
  spec: {cidrs: [10.96.0.0/16, 10.97.0.0/16]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: dup}
data: {x: "1", x: "2"}
`

// cachedLoad loads path with a cache in dir and returns the objects and
// what was logged.
func cachedLoad(t *testing.T, path, dir string) (*Objects, string) {
	t.Helper()
	var logs bytes.Buffer
	objs, err := LoadWith(path, LoadOptions{CacheDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("LoadWith: %v\n%s", err, logs.String())
	}
	return objs, logs.String()
}

// parsed returns what Parse makes of content.
func parsed(t *testing.T, content string) *Objects {
	t.Helper()
	objs, err := Parse(strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// writeFile writes content to path.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadCacheHit: a second load of the same bytes reads the cache file
// the first wrote, and its objects are the parse's.
func TestLoadCacheHit(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), filepath.Join(t.TempDir(), "cache")
	writeFile(t, path, cacheManifest)
	want := parsed(t, cacheManifest)
	first, logs := cachedLoad(t, path, dir)
	if strings.Contains(logs, logHit) {
		t.Fatalf("first load read a cache:\n%s", logs)
	}
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("first load: %+v, want %+v", first, want)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.cache"))
	if len(files) != 1 {
		t.Fatalf("cache files %v, want one", files)
	}
	for range 2 {
		got, logs := cachedLoad(t, path, dir)
		if !strings.Contains(logs, logHit) {
			t.Fatalf("load of the same bytes did not read the cache:\n%s", logs)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("from the cache: %+v, want %+v", got, want)
		}
	}
}

// TestLoadCacheMissOnChangedBytes: a file whose bytes changed is parsed,
// not read from the cache of its old content, and the cache then holds
// the new content.
func TestLoadCacheMissOnChangedBytes(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
	writeFile(t, path, cacheManifest)
	cachedLoad(t, path, dir)
	// One byte: the web Service's cluster IP.
	changed := strings.Replace(cacheManifest, "clusterIP: 10.96.0.10", "clusterIP: 10.96.0.11", 1)
	writeFile(t, path, changed)
	got, logs := cachedLoad(t, path, dir)
	if strings.Contains(logs, logHit) || !strings.Contains(logs, logOther) {
		t.Fatalf("load of changed bytes:\n%s", logs)
	}
	if ip := got.Services[0].Spec.ClusterIP; ip != "10.96.0.11" {
		t.Errorf("cluster IP %s, want the changed file's 10.96.0.11", ip)
	}
	if !reflect.DeepEqual(got, parsed(t, changed)) {
		t.Errorf("objects of the changed file differ from its parse")
	}
	if _, logs := cachedLoad(t, path, dir); !strings.Contains(logs, logHit) {
		t.Errorf("the cache was not rewritten for the changed file:\n%s", logs)
	}
}

// TestLoadCacheNotWrittenForBadFile: a file that does not parse
// completely is not cached.
func TestLoadCacheNotWrittenForBadFile(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
	writeFile(t, path, manifest+"---\nkind: Service\nspec: 3\n")
	for range 2 {
		if _, err := LoadWith(path, LoadOptions{CacheDir: dir}); err == nil {
			t.Fatal("a file with a bad document loaded without error")
		}
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Errorf("cache files %v for a file that does not parse", files)
	}
}

// TestLoadCacheCorruptFallsBack: a cache file that is damaged, of
// another format or converter, or rewritten is not used: the file is
// parsed (and its objects are right), and the cache rewritten.
func TestLoadCacheCorruptFallsBack(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"a byte of an object": func(b []byte) []byte {
			return bytes.Replace(b, []byte(`"10.96.0.10"`), []byte(`"10.96.0.99"`), -1)
		},
		"truncated": func(b []byte) []byte { return b[:len(b)-40] },
		"header only": func(b []byte) []byte {
			_, body, _ := bytes.Cut(b, []byte("\nbody "))
			_, docs, _ := bytes.Cut(body, []byte("\n"))
			return b[:len(b)-len(docs)]
		},
		"a huge count": func(b []byte) []byte {
			head, rest, _ := bytes.Cut(b, []byte("\nbody "))
			line, docs, _ := bytes.Cut(rest, []byte("\n"))
			sum, _, _ := bytes.Cut(line, []byte(" "))
			return slices.Concat(head, []byte("\nbody "), sum, []byte(" 999999999999\n"), docs)
		},
		"empty":          func([]byte) []byte { return nil },
		"not a cache":    func([]byte) []byte { return []byte("hello\nworld\n") },
		"another format": func(b []byte) []byte { return bytes.Replace(b, []byte(cacheMagic+" 1 "), []byte(cacheMagic+" 0 "), 1) },
		"another version": func(b []byte) []byte {
			return bytes.Replace(b, []byte("\nsource "), []byte(" sigs.k8s.io/yaml@v0.0.1\nsource "), 1)
		},
		"a line without kind": func(b []byte) []byte {
			return bytes.Replace(b, []byte("Service\t{"), []byte("{"), 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
			writeFile(t, path, cacheManifest)
			want := parsed(t, cacheManifest)
			cachedLoad(t, path, dir)
			file := (&cache{dir: dir, path: path}).file()
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bad := damage(bytes.Clone(b))
			if bytes.Equal(bad, b) {
				t.Fatal("damage changed nothing")
			}
			if err := os.WriteFile(file, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			got, logs := cachedLoad(t, path, dir)
			if strings.Contains(logs, logHit) || !strings.Contains(logs, logUnusable) {
				t.Fatalf("load over a damaged cache:\n%s", logs)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("objects over a damaged cache: %+v, want %+v", got, want)
			}
			if _, logs := cachedLoad(t, path, dir); !strings.Contains(logs, logHit) {
				t.Errorf("the damaged cache was not rewritten:\n%s", logs)
			}
		})
	}
}

// TestSourceCache: a Source with a CacheDir writes the cache once it has
// delivered the file, and a new Source over the same bytes (a restarted
// process) reads it and delivers the same events.
func TestSourceCache(t *testing.T) {
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
	writeFile(t, path, cacheManifest)
	var events []string
	for i := range 2 {
		var logs bytes.Buffer
		ev := &fakeproxier.Events{}
		src := &Source{Path: path, CacheDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		if err := src.Run(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
		got := ev.Take()
		if hit := strings.Contains(logs.String(), logHit); hit != (i == 1) {
			t.Fatalf("run %d: read the cache %v:\n%s", i, hit, logs.String())
		}
		if i == 0 {
			events = got
			continue
		}
		if !reflect.DeepEqual(got, events) {
			t.Errorf("events from the cache:\n%v\nwant, as parsed:\n%v", got, events)
		}
	}
}

// TestTypeShape: the shape that keys the cache changes with a field's
// JSON name or type, so a binary whose types accept other fields does
// not read another's cache without the strict check.
func TestTypeShape(t *testing.T) {
	type inner struct {
		A string `json:"a"`
	}
	type v1 struct {
		X inner  `json:"x"`
		Y []byte `json:"y,omitempty"`
	}
	type v2 struct {
		X inner  `json:"x"`
		Y []byte `json:"z,omitempty"`
	}
	type v3 struct {
		X *inner `json:"x"`
		Y []byte `json:"y,omitempty"`
	}
	shape := func(v any) string {
		var b strings.Builder
		typeShape(&b, reflect.TypeOf(v), map[reflect.Type]bool{})
		return strings.ReplaceAll(b.String(), reflect.TypeOf(v).Name(), "T")
	}
	if shape(v1{}) != shape(v1{}) {
		t.Fatal("a type's shape changes")
	}
	for name, other := range map[string]any{"a field's JSON name": v2{}, "a field's type": v3{}} {
		if shape(other) == shape(v1{}) {
			t.Errorf("%s changed, the shape did not: %s", name, shape(other))
		}
	}
	if v := cacheVersion(); !strings.Contains(v, " types:") {
		t.Errorf("cache version %q without the types' shape", v)
	}
}
