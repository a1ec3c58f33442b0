package static

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// sameObjects reports whether the objects of a and b are equal as
// equality.Semantic compares them (how Source compares objects): a
// cache file returns an empty list or map as nil.
func sameObjects(a, b *Objects) bool {
	return equality.Semantic.DeepEqual(a.Services, b.Services) &&
		equality.Semantic.DeepEqual(a.EndpointSlices, b.EndpointSlices) &&
		equality.Semantic.DeepEqual(a.Nodes, b.Nodes) &&
		slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs) && a.Documents == b.Documents
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
		if !sameObjects(got, want) {
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
	if !sameObjects(got, parsed(t, changed)) {
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
			return bytes.Replace(b, []byte("10.96.0.10"), []byte("10.96.0.99"), -1)
		},
		"truncated": func(b []byte) []byte { return b[:len(b)-40] },
		"header only": func(b []byte) []byte {
			_, body := splitCache(t, b)
			return b[:len(b)-len(body)]
		},
		"a huge count": func(b []byte) []byte {
			h, body := splitCache(t, b)
			f := strings.Fields(h[2])
			f[3] = "999999999999"
			h[2] = strings.Join(f, " ")
			return joinCache(h, body)
		},
		"a count off by one": func(b []byte) []byte {
			h, body := splitCache(t, b)
			f := strings.Fields(h[2])
			n, _ := strconv.Atoi(f[4])
			f[4] = strconv.Itoa(n + 1)
			h[2] = strings.Join(f, " ")
			return joinCache(h, body)
		},
		"a line too long": func(b []byte) []byte {
			h, body := splitCache(t, b)
			h[1] += strings.Repeat(" ", cacheHeaderMax)
			return joinCache(h, body)
		},
		"empty":       func([]byte) []byte { return nil },
		"not a cache": func([]byte) []byte { return []byte("hello\nworld\n") },
		"another format": func(b []byte) []byte {
			return bytes.Replace(b, fmt.Appendf(nil, "%s %d ", cacheMagic, cacheFormat), fmt.Appendf(nil, "%s %d ", cacheMagic, cacheFormat-1), 1)
		},
		"another version": func(b []byte) []byte {
			return bytes.Replace(b, []byte("\nsource "), []byte(" sigs.k8s.io/yaml@v0.0.1\nsource "), 1)
		},
		// Damage behind a body hash that matches: the records' own checks.
		"an unknown record kind": func(b []byte) []byte {
			h, body := splitCache(t, b)
			body[0] = 'X'
			return joinCache(rehash(h, body), body)
		},
		"a record past the end": func(b []byte) []byte {
			h, body := splitCache(t, b)
			body = body[:len(body)-1]
			return joinCache(rehash(h, body), body)
		},
		"records out of order": func(b []byte) []byte {
			h, body := splitCache(t, b)
			// The first record (a Service) moved to the end.
			l, k := binary.Uvarint(body[1:])
			first := 1 + k + int(l)
			body = slices.Concat(body[first:], body[:first])
			return joinCache(rehash(h, body), body)
		},
		"a protobuf that does not decode": func(b []byte) []byte {
			h, body := splitCache(t, b)
			// The first record's object: kind, length, the apiVersion's
			// length and the apiVersion ("v1"), then its first tag.
			_, k := binary.Uvarint(body[1:])
			body[1+k+1+2] = 0x0f // field 1, wire type 7: none
			return joinCache(rehash(h, body), body)
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
			if !reflect.DeepEqual(got, want) { // parsed: the same objects exactly
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

// splitCache returns the header lines and the body of a cache file.
func splitCache(t *testing.T, b []byte) (header [3]string, body []byte) {
	t.Helper()
	for i := range header {
		line, rest, ok := bytes.Cut(b, []byte("\n"))
		if !ok {
			t.Fatalf("cache file of %d header lines", i)
		}
		header[i], b = string(line), rest
	}
	return header, b
}

// joinCache is a cache file of header and body.
func joinCache(header [3]string, body []byte) []byte {
	return slices.Concat([]byte(strings.Join(header[:], "\n")+"\n"), body)
}

// rehash returns header with the hash of body.
func rehash(header [3]string, body []byte) [3]string {
	f := strings.Fields(header[2])
	sum := sha256.Sum256(body)
	f[1] = hex.EncodeToString(sum[:])
	header[2] = strings.Join(f, " ")
	return header
}

// TestLoadCacheManyObjects: objects decoded from the cache on several
// goroutines come back in the parse's order.
func TestLoadCacheManyObjects(t *testing.T) {
	const n = 5*parseChunk + 7 // several chunks of each kind, one partial
	data := benchFile(n)
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
	writeFile(t, path, string(data))
	want := parsed(t, string(data))
	cachedLoad(t, path, dir)
	got, logs := cachedLoad(t, path, dir)
	if !strings.Contains(logs, logHit) {
		t.Fatalf("second load did not read the cache:\n%s", logs)
	}
	if len(got.Services) != n || len(got.EndpointSlices) != n {
		t.Fatalf("%d services, %d slices from the cache, want %d each", len(got.Services), len(got.EndpointSlices), n)
	}
	if !sameObjects(got, want) {
		for i := range n {
			if got.Services[i].Name != want.Services[i].Name || got.EndpointSlices[i].Name != want.EndpointSlices[i].Name {
				t.Fatalf("object %d from the cache: %s, %s; want %s, %s", i, got.Services[i].Name, got.EndpointSlices[i].Name, want.Services[i].Name, want.EndpointSlices[i].Name)
			}
		}
		t.Fatal("objects from the cache differ from the parse")
	}
}

// TestCacheKeepsEveryField: an object with every field of its type set
// comes back from a cache file the same, apiVersion and kind included
// (which the protobuf does not hold): no field of the types is lost.
func TestCacheKeepsEveryField(t *testing.T) {
	var next int
	want := &Objects{
		Services:       []*v1.Service{fillAll(t, &v1.Service{}, &next)},
		EndpointSlices: []*discoveryv1.EndpointSlice{fillAll(t, &discoveryv1.EndpointSlice{}, &next)},
		Nodes:          []*v1.Node{fillAll(t, &v1.Node{}, &next)},
		ServiceCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00::/108")},
		Documents:      5,
	}
	// The kind is the object's (what parsing decoded by).
	want.Services[0].Kind, want.EndpointSlices[0].Kind, want.Nodes[0].Kind = "Service", "EndpointSlice", "Node"
	path, dir := filepath.Join(t.TempDir(), "svc.yaml"), t.TempDir()
	writeFile(t, path, "not parsed")
	c := &cache{dir: dir, path: path}
	sum := sha256.Sum256([]byte("not parsed"))
	if err := c.store(sum, len("not parsed"), want); err != nil {
		t.Fatal(err)
	}
	got, err := c.load(sum, len("not parsed"))
	if err != nil {
		t.Fatal(err)
	}
	// Every list and map is set: nil and empty cannot differ.
	if !sameObjects(got, want) || !equality.Semantic.DeepEqualWithNilDifferentFromEmpty(
		[]any{got.Services, got.EndpointSlices, got.Nodes}, []any{want.Services, want.EndpointSlices, want.Nodes}) {
		t.Errorf("from the cache:\n%s", cmp.Diff(want, got, cmp.Exporter(func(reflect.Type) bool { return true })))
	}
}

// fillAll sets every field reachable from o to a value that is not
// zero (every pointer set, every list and map of one element), each
// scalar with its own number from *next, and returns o.
func fillAll[T any](t *testing.T, o *T, next *int) *T {
	t.Helper()
	fillValue(t, reflect.ValueOf(o).Elem(), next, 0)
	return o
}

func fillValue(t *testing.T, v reflect.Value, next *int, depth int) {
	if depth > 20 {
		t.Fatalf("%s: types nested too deep", v.Type())
	}
	*next++
	n := *next
	switch v.Interface().(type) {
	case metav1.Time:
		v.Set(reflect.ValueOf(metav1.NewTime(time.Unix(int64(1_700_000_000+n), 0))))
		return
	case metav1.MicroTime:
		v.Set(reflect.ValueOf(metav1.NewMicroTime(time.Unix(int64(1_700_000_000+n), 1000))))
		return
	case resource.Quantity:
		v.Set(reflect.ValueOf(resource.MustParse(fmt.Sprintf("%dMi", n))))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n % 128))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillValue(t, v.Elem(), next, depth+1)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillValue(t, v.Index(0), next, depth+1)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillValue(t, k, next, depth+1)
		fillValue(t, e, next, depth+1)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				t.Fatalf("%s: unexported field %s", v.Type(), v.Type().Field(i).Name)
			}
			fillValue(t, v.Field(i), next, depth+1)
		}
	default:
		t.Fatalf("%s: kind %s not filled", v.Type(), v.Kind())
	}
}

// TestProtoCount: the endpoints of an EndpointSlice's protobuf are
// counted (the capacity its decoding gets), and a message cut short
// counts what it holds.
func TestProtoCount(t *testing.T) {
	s := &discoveryv1.EndpointSlice{}
	s.Name = "web-1"
	for i := range 5 {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.0.%d", i)}})
	}
	s.Ports = []discoveryv1.EndpointPort{{}}
	pb, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if n := protoCount(pb, 2); n != 5 {
		t.Errorf("endpoints counted %d, want 5", n)
	}
	if n := protoCount(pb[:len(pb)-1], 2); n != 5 {
		t.Errorf("endpoints counted %d in a message cut short, want 5", n)
	}
	if n := protoCount([]byte{0x12, 0xff}, 2); n != 0 {
		t.Errorf("a length past the end counted %d", n)
	}
	got := &discoveryv1.EndpointSlice{}
	sizeEndpoints(got, pb)
	if cap(got.Endpoints) != 5 {
		t.Errorf("capacity %d for 5 endpoints", cap(got.Endpoints))
	}
}
