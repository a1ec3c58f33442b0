package static

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
)

const manifest = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: true}
---
# a comment-only document
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: dns}
  spec:
    clusterIP: 10.96.0.53
    ports: [{name: dns, port: 53, protocol: UDP}]
`

func TestParse(t *testing.T) {
	objs, err := Parse(strings.NewReader(manifest))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Services) != 2 || len(objs.EndpointSlices) != 1 {
		t.Fatalf("got %d services, %d slices; want 2, 1", len(objs.Services), len(objs.EndpointSlices))
	}
	if objs.Services[1].Namespace != "default" {
		t.Errorf("namespace defaulted to %q, want default", objs.Services[1].Namespace)
	}
}

func TestParseSkipsBadDocuments(t *testing.T) {
	bad := manifest + `
---
apiVersion: v1
kind: Service
metadata: {name: broken}
spec:
  ports: "not a list"
---
apiVersion: v1
kind: Service
metadata: {name: typo}
spec:
  clusterIPz: 10.0.0.1
`
	objs, err := Parse(strings.NewReader(bad))
	var de *DocumentError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want a DocumentError", err)
	}
	if !strings.Contains(err.Error(), "document 5") || !strings.Contains(err.Error(), "document 6") {
		t.Errorf("error does not name both bad documents: %v", err)
	}
	if len(objs.Services) != 2 {
		t.Fatalf("good documents lost: %d services", len(objs.Services))
	}
}

// TestParseManyInFileOrder: a file of more documents than one worker
// takes at a time parses to its objects and errors in file order.
func TestParseManyInFileOrder(t *testing.T) {
	var b strings.Builder
	bad := map[int]bool{70: true, 200: true, 201: true}
	const n = 300
	for i := range n {
		if bad[i] {
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: bad-%d}\nspec: {clusterIPz: 10.0.0.1}\n", i)
			continue
		}
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: svc-%d}\nspec: {clusterIP: 10.96.%d.%d}\n", i, i/250, i%250+1)
		if i%3 == 0 {
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ServiceCIDR\nmetadata: {name: c%d}\nspec: {cidrs: [10.%d.0.0/16]}\n", i, i%2)
		}
	}
	objs, err := Parse(strings.NewReader(b.String()))
	var got []string
	for _, s := range objs.Services {
		got = append(got, s.Name)
	}
	var want []string
	for i := range n {
		if !bad[i] {
			want = append(want, fmt.Sprintf("svc-%d", i))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("services out of file order: %v", got)
	}
	if c := fmt.Sprint(objs.ServiceCIDRs); c != "[10.0.0.0/16 10.1.0.0/16]" {
		t.Errorf("service CIDRs %s, want the two in file order", c)
	}
	var names []string
	for _, e := range joinedErrors(err) {
		var de *DocumentError
		if !errors.As(e, &de) {
			t.Fatalf("%v: not a DocumentError", e)
		}
		names = append(names, de.Name)
	}
	if fmt.Sprint(names) != "[bad-70 bad-200 bad-201]" {
		t.Errorf("errors %v, want the three bad documents in file order", names)
	}
}

func joinedErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err != nil {
		return []error{err}
	}
	return nil
}

func TestSourceWatchDeliversDifferences(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := &fakeproxier.Events{}
	src := &Source{Path: path, Watch: 10 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, ev) }()
	defer func() { cancel(); <-done }()

	waitFor := func(want []string) {
		t.Helper()
		var got []string
		for range 200 {
			got = append(got, ev.Take()...)
			if len(got) >= len(want) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
	}
	waitFor([]string{"svc+ web", "svc+ dns", "eps+ web-1", "svc synced", "eps synced", "node synced"})

	// Change one endpoint, drop the dns service.
	next := strings.Replace(manifest, "10.244.1.2", "10.244.1.3", 1)
	next = next[:strings.Index(next, "apiVersion: v1\nkind: List")]
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"eps~ web-1", "svc- dns"})

	// ServiceCIDR objects hand on their ranges, all of them at once.
	cidrs := next + "---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16, 'fd00:10:96::/108']}\n"
	if err := os.WriteFile(path, []byte(cidrs), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"cidrs [10.96.0.0/16 fd00:10:96::/108]"})
}

// watched runs a Source on a file in a temporary directory, watching it
// every 5 ms, and records its events and its log.
type watched struct {
	t    *testing.T
	path string
	ev   *fakeproxier.Events
	log  *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the log handler and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func watch(t *testing.T, content *string) *watched {
	t.Helper()
	w := &watched{t: t, path: filepath.Join(t.TempDir(), "svc.yaml"), ev: &fakeproxier.Events{}, log: &syncBuffer{}}
	if content != nil {
		w.write(*content)
	}
	src := &Source{Path: w.path, Watch: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(w.log, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, w.ev) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *watched) write(content string) {
	w.t.Helper()
	if err := os.WriteFile(w.path, []byte(content), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// settle waits until the source has looked at the file's current content
// at least twice (it reads every 5 ms), then returns the events since the
// last call.
func (w *watched) settle() []string {
	time.Sleep(100 * time.Millisecond)
	got := w.ev.Take()
	slices.Sort(got)
	return got
}

// waitLog waits until the log holds want.
func (w *watched) waitLog(want string) {
	w.t.Helper()
	for range 400 {
		if strings.Contains(w.log.String(), want) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.t.Fatalf("log never said %q; log:\n%s", want, w.log.String())
}

var initialEvents = []string{"eps synced", "eps+ web-1", "node synced", "svc synced", "svc+ dns", "svc+ web"}

// TestSourceKeepsStateOnUnusableFile checks that an empty, comment-only,
// truncated or otherwise broken file removes nothing, says why in the
// log, and that the file applies once it parses again.
func TestSourceKeepsStateOnUnusableFile(t *testing.T) {
	content := manifest
	w := watch(t, &content)
	if got := w.settle(); !slices.Equal(got, initialEvents) {
		t.Fatalf("events = %v, want %v", got, initialEvents)
	}
	cut := manifest[:strings.Index(manifest, "  conditions: {ready: true}")] + "  conditions: {ready: tr"
	for _, bad := range []struct{ name, content, log string }{
		{"empty", "", "file holds no document"},
		{"whitespace and comments", "\n# rewritten soon\n---\n", "file holds no document"},
		{"cut in a document", cut, "does not parse completely"},
		{"unknown field", strings.Replace(manifest, "clusterIP: 10.96.0.53", "clusterIPz: 10.96.0.53", 1), `document 4 (List): item 0: Service: json: unknown field \"clusterIPz\"`},
		{"no kind", manifest + "---\nmetadata: {name: x}\n", "document 5 (x): no kind"},
	} {
		w.write(bad.content)
		w.waitLog(bad.log)
		if got := w.settle(); len(got) != 0 {
			t.Errorf("%s file: events %v, want none", bad.name, got)
		}
	}
	// The good file again: nothing changed since the objects delivered
	// last, so nothing is delivered.
	w.write(manifest)
	if got := w.settle(); len(got) != 0 {
		t.Errorf("good file again: events %v, want none", got)
	}
	// A change after a bad file applies.
	w.write("")
	w.waitLog("file holds no document")
	w.write(manifest[:strings.Index(manifest, "apiVersion: v1\nkind: List")])
	if got, want := w.settle(), []string{"svc- dns"}; !slices.Equal(got, want) {
		t.Errorf("good file after an empty one: events %v, want %v", got, want)
	}
	// An empty List says there is nothing: everything goes.
	w.write("apiVersion: v1\nkind: List\nitems: []\n")
	if got, want := w.settle(), []string{"eps- web-1", "svc- web"}; !slices.Equal(got, want) {
		t.Errorf("empty List: events %v, want %v", got, want)
	}
}

// TestSourceWaitsForFile checks that a watched file missing at start is
// read once it appears, that nothing is marked synced before, and that
// the missing file is not logged at every look.
func TestSourceWaitsForFile(t *testing.T) {
	w := watch(t, nil)
	w.waitLog("cannot read file")
	if got := w.settle(); len(got) != 0 {
		t.Fatalf("events before the file exists: %v, want none", got)
	}
	if n := strings.Count(w.log.String(), "cannot read file"); n != 1 {
		t.Errorf("missing file logged %d times in over 20 looks, want once", n)
	}
	// A file that appears broken is still not applied.
	w.write("")
	w.waitLog("file holds no document")
	if got := w.settle(); len(got) != 0 {
		t.Fatalf("events for an empty file: %v, want none", got)
	}
	w.write(manifest)
	if got := w.settle(); !slices.Equal(got, initialEvents) {
		t.Fatalf("events once the file exists = %v, want %v", got, initialEvents)
	}
}

// TestSourceOnceFailsOnUnusableFile checks that a source that reads once
// returns why instead of marking an unusable file synced.
func TestSourceOnceFailsOnUnusableFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]*string{"missing": nil, "empty": ptr(""), "broken": ptr(manifest + "---\nkind: Service\nspec: 3\n")} {
		path := filepath.Join(dir, name+".yaml")
		if content != nil {
			if err := os.WriteFile(path, []byte(*content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ev := &fakeproxier.Events{}
		if err := (&Source{Path: path}).Run(context.Background(), ev); err == nil {
			t.Errorf("%s file: Run returned nil", name)
		}
		if got := ev.Take(); len(got) != 0 {
			t.Errorf("%s file: events %v, want none", name, got)
		}
	}
}

func ptr(s string) *string { return &s }

// TestParseDuplicateKeys: a duplicate key fails a document of a kind
// the source decodes, and not one of a kind it ignores (as when every
// document was decoded with yaml.UnmarshalStrict after a lenient peek at
// its kind).
func TestParseDuplicateKeys(t *testing.T) {
	ignored := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {x: \"1\", x: \"2\"}\n"
	if objs, err := Parse(bytes.NewReader([]byte(ignored))); err != nil || objs.Documents != 1 {
		t.Errorf("ConfigMap with a duplicate key: %d documents, %v; want it ignored", objs.Documents, err)
	}
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: a, name: b}\nspec: {clusterIP: 10.96.0.1}\n"
	if objs, err := Parse(bytes.NewReader([]byte(svc))); err == nil || len(objs.Services) != 0 {
		t.Errorf("Service with a duplicate key: %d services, %v; want an error", len(objs.Services), err)
	}
}

// TestSourceDuplicateNames: a name given twice in the file that is
// delivered first is added, then updated to its last object (as any
// later delivery does), and a later file changes or deletes what it
// delivered.
func TestSourceDuplicateNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svc.yaml")
	twice := manifest + "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec: {clusterIP: 10.96.0.99, ports: [{port: 80}]}\n"
	writeFile(t, path, twice)
	ev := &fakeproxier.Events{}
	src := &Source{Path: path}
	if err := src.Run(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	if got, want := ev.Take(), []string{"svc+ web", "svc+ dns", "svc~ web", "eps+ web-1", "svc synced", "eps synced", "node synced"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if ip := src.services["demo/web"].Spec.ClusterIP; ip != "10.96.0.99" {
		t.Errorf("demo/web delivered last with %s, want the file's last object (10.96.0.99)", ip)
	}
	writeFile(t, path, manifest[:strings.Index(manifest, "---")])
	if err := src.reload(ev, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	got := ev.Take()
	slices.Sort(got)
	if want := []string{"eps- web-1", "svc- dns", "svc~ web"}; !slices.Equal(got, want) { // web back to 10.96.0.10
		t.Errorf("events %v, want %v", got, want)
	}
}
