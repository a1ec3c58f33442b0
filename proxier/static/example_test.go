package static_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/proxykit/proxykit/proxier/fakeproxier"
	"github.com/proxykit/proxykit/proxier/static"
)

// A Source reads a file of Services and EndpointSlices once (or watches
// it) and delivers them to a Proxier; here the recording fake stands in
// for a real one.
func ExampleSource() {
	dir, err := os.MkdirTemp("", "static-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "services.yaml")
	objects := `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: true}}]
`
	if err := os.WriteFile(path, []byte(objects), 0o644); err != nil {
		panic(err)
	}
	p := &fakeproxier.Events{}
	src := &static.Source{Path: path} // no Watch: read once
	if err := src.Run(context.Background(), p); err != nil {
		panic(err)
	}
	for _, line := range p.Lines() {
		fmt.Println(line)
	}
	// Output:
	// svc+ web
	// eps+ web-1
	// svc synced
	// eps synced
	// node synced
}
