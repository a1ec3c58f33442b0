package static

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkParse parses n Services and their EndpointSlices (10
// endpoints each), one YAML document per object, as a static source of
// a big cluster holds them.
func BenchmarkParse(b *testing.B) {
	const n = 1000
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
	data := buf.Bytes()
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
