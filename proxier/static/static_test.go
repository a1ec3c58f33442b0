package static

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/fakeproxier"
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
}
