package static

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchObjects is how many Services (and as many EndpointSlices) the
// benchmarks' file holds.
const benchObjects = 1000

// benchFile returns n Services and their EndpointSlices (10 endpoints
// each), one YAML document per object, as a static source of a big
// cluster holds them.
func benchFile(n int) []byte {
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `---
apiVersion: v1
kind: Service
metadata:
  name: svc-%d
  namespace: scale
spec:
  clusterIP: 10.96.%d.%d
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%d-abcde
  namespace: scale
  labels:
    kubernetes.io/service-name: svc-%d
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
`, i, i/250, i%250+1, i, i)
		for e := range 10 {
			fmt.Fprintf(&buf, "- addresses: [\"10.%d.%d.%d\"]\n  conditions: {ready: true}\n  nodeName: node%d\n", 1+i/65536, i/256%256, i%256, e)
		}
	}
	return buf.Bytes()
}

// BenchmarkParse parses the benchmarks' file.
func BenchmarkParse(b *testing.B) {
	const n = benchObjects
	data := benchFile(n)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		objs, err := Parse(bytes.NewReader(data))
		if err != nil || len(objs.Services) != n || len(objs.EndpointSlices) != n {
			b.Fatalf("%d services, %d slices, %v", len(objs.Services), len(objs.EndpointSlices), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(2*n)/1000, "µs/object")
}

// BenchmarkLoadCached loads the benchmarks' file from a cache directory
// that holds its decoded documents (a restart over the same file).
func BenchmarkLoadCached(b *testing.B) {
	const n = benchObjects
	data := benchFile(n)
	path := filepath.Join(b.TempDir(), "services.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	var logs bytes.Buffer
	opts := LoadOptions{CacheDir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if _, err := LoadWith(path, opts); err != nil { // writes the cache
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		objs, err := LoadWith(path, opts)
		if err != nil || len(objs.Services) != n || len(objs.EndpointSlices) != n {
			b.Fatalf("%d services, %d slices, %v", len(objs.Services), len(objs.EndpointSlices), err)
		}
	}
	b.StopTimer()
	if hits := strings.Count(logs.String(), "read the decoded documents from the cache"); hits != b.N {
		b.Fatalf("%d cache hits of %d loads:\n%s", hits, b.N, logs.String())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(2*n)/1000, "µs/object")
}
