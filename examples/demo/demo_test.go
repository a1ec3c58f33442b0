package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/static"
	"github.com/proxykit/proxykit/sandbox"
)

// syncBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// block returns the lines of the report of one service port, from its
// title line (which starts with title) to the next blank line.
func block(t *testing.T, out, title string) []string {
	t.Helper()
	var lines []string
	in := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, title):
			in, lines = true, []string{l}
		case in && l == "":
			return lines
		case in:
			lines = append(lines, l)
		}
	}
	if !in {
		t.Fatalf("no report for %q in the output:\n%s", title, out)
	}
	return lines
}

// probeLine returns the line of a block that reports requests from a
// host.
func probeLine(t *testing.T, lines []string, from string) string {
	t.Helper()
	for _, l := range lines {
		if strings.HasPrefix(l, "  "+from+" ") && strings.Contains(l, "→") {
			return l
		}
	}
	t.Fatalf("no line for requests from %s in:\n%s", from, strings.Join(lines, "\n"))
	return ""
}

var podRe = regexp.MustCompile(`node[12]-pod\d ×\d+`)

// answeredBy returns the pods a probe line says answered.
func answeredBy(line string) []string {
	var pods []string
	for _, m := range podRe.FindAllString(line, -1) {
		pods = append(pods, strings.Fields(m)[0])
	}
	return pods
}

func noNamespacesLeft(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`sandbox pk-([0-9a-f]{8})`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no sandbox ID in the output")
	}
	if left, _ := filepath.Glob(filepath.Join(sandbox.NetNSDir, "pk-"+m[1]+"-*")); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}

// TestDemo runs the demo with the bundled services, with every backend,
// and checks that its report shows real answers from the sandbox's pods,
// as each service's kind requires, and that it tears the sandbox down.
func TestDemo(t *testing.T) {
	sandbox.RequirePrivilege(t)
	for _, name := range backends.Names() {
		t.Run(name, func(t *testing.T) { testDemo(t, name) })
	}
}

func testDemo(t *testing.T, backend string) {
	var out, logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := run(ctx, options{backend: backend, requests: 8}, &out, &logs)
	if errors.Is(err, proxier.ErrNotSupported) {
		// Not a missing privilege: the kernel lacks what the backend
		// needs (IPVS on this machine).
		t.Skipf("backend %s cannot run on this kernel: %v", backend, err)
	}
	if err != nil {
		t.Fatalf("run: %v\n%s\nlogs:\n%s", err, out.String(), logs.String())
	}
	o := out.String()
	t.Logf("output:\n%s", o)
	if l := logs.String(); l != "" {
		t.Logf("logs:\n%s", l)
	}

	// ClusterIP: answered by the service's pods only, from the node and
	// from a pod.
	web := block(t, o, "demo/web ")
	for _, from := range []string{"node1", "node1-pod1"} {
		pods := answeredBy(probeLine(t, web, from))
		if len(pods) == 0 {
			t.Errorf("web from %s: no pod answered", from)
		}
		for _, p := range pods {
			if p != "node1-pod1" && p != "node1-pod2" && p != "node2-pod1" {
				t.Errorf("web from %s: answered by %s, not an endpoint", from, p)
			}
		}
	}
	// UDP.
	if pods := answeredBy(probeLine(t, block(t, o, "demo/dns "), "node1")); len(pods) == 0 {
		t.Error("dns (UDP) from node1: no pod answered")
	}
	// NodePort, policy Cluster: the client is masqueraded to node1.
	np := probeLine(t, block(t, o, "demo/nodeport "), "client")
	if len(answeredBy(np)) == 0 || !strings.Contains(np, "source seen: node1 (") || strings.Contains(np, "198.51.100.2") {
		t.Errorf("nodeport from the client: want answers seeing node1's address, got %q", np)
	}
	// NodePort, policy Local: only node1's own endpoint, seeing the
	// client's real address.
	local := probeLine(t, block(t, o, "demo/local "), "client")
	if pods := answeredBy(local); len(pods) != 1 || pods[0] != "node1-pod3" {
		t.Errorf("local from the client: answered by %v, want node1-pod3 only: %q", pods, local)
	}
	if !strings.Contains(local, "source seen: client (198.51.100.2)") {
		t.Errorf("local from the client: the pod must see the client's address: %q", local)
	}
	// Session affinity: each client stays on one pod.
	sticky := block(t, o, "demo/sticky ")
	for _, from := range []string{"node1", "node1-pod1"} {
		l := probeLine(t, sticky, from)
		if pods := answeredBy(l); len(pods) != 1 || !strings.Contains(l, "×8") {
			t.Errorf("sticky from %s: want all 8 requests on one pod: %q", from, l)
		}
	}
	// No endpoints: refused at once, not left to time out.
	for _, from := range []string{"node1", "node1-pod1"} {
		if l := probeLine(t, block(t, o, "demo/empty "), from); !strings.Contains(l, "refused") {
			t.Errorf("empty from %s: want refused: %q", from, l)
		}
	}
	if !strings.Contains(o, "What "+backend+" programmed in node1") {
		t.Errorf("no listing of what %s programmed", backend)
	}
	if backend == "ebpf" {
		if left, _ := filepath.Glob("/sys/fs/cgroup/*/proxykit-demo-*"); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
		if left, _ := filepath.Glob("/sys/fs/cgroup/proxykit-demo-*"); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
	}
	if backend != "nftables" {
		noNamespacesLeft(t, o)
		return
	}
	// What nftables programmed, read back from the kernel: the dispatch
	// maps (the backend's documented contract) and where a packet to each
	// service address may be DNATed.
	if l := lineOf(o, "    10.96.0.10 . tcp . 80 "); !strings.Contains(l, "→ node1-pod1:8080, node1-pod2:8080, node2-pod1:8080") {
		t.Errorf("listing of web: %q", l)
	}
	for _, want := range []string{
		"10.96.0.50 . tcp . 80 → goto reject-chain",
		// local's node port: outside clients reach the local endpoint only.
		"tcp . 30081 ",
		"→ node1-pod3:8081 (some sources: node1-pod3:8081, node2-pod2:8081)",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("the listing of the nftables table lacks %q", want)
		}
	}
	noNamespacesLeft(t, o)
}

// TestDemoWatch runs the demo on a file of its own with --watch, edits
// the file, and checks that the change is programmed and probed live,
// and that cancelling (Ctrl-C) tears everything down.
func TestDemoWatch(t *testing.T) {
	sandbox.RequirePrivilege(t)
	path := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(path, bundledServices, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, options{backend: "nftables", services: path, watch: true, requests: 4}, &out, &logs)
	}()
	waitFor := func(s string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), s); {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the output:\n%s\nlogs:\n%s", s, out.String(), logs.String())
			}
			select {
			case err := <-done:
				t.Fatalf("run returned early: %v\n%s", err, out.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	waitFor("Watching ")

	// Give the empty service an endpoint.
	edited := string(bundledServices) + `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: empty-1
  namespace: demo
  labels: {kubernetes.io/service-name: empty}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.2.3], nodeName: node2, conditions: {ready: true}}
`
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("services.yaml changed at")
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(after(out.String(), "services.yaml changed at"), "(source seen:"); {
		if time.Now().After(deadline) {
			t.Fatalf("no second round of probes:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	second := after(out.String(), "services.yaml changed at")
	if l := probeLine(t, block(t, second, "demo/empty "), "node1"); len(answeredBy(l)) != 1 || !strings.Contains(l, "node2-pod2") {
		t.Errorf("after the edit, empty from node1: want node2-pod2: %q", l)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after its context was cancelled")
	}
	noNamespacesLeft(t, out.String())
}

func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

func after(s, sep string) string {
	_, rest, _ := strings.Cut(s, sep)
	return rest
}

// TestUnknownBackend checks the error that lists the backends.
func TestUnknownBackend(t *testing.T) {
	err := run(context.Background(), options{backend: "no-such-backend"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown backend "no-such-backend" (available: `) || !strings.Contains(err.Error(), "nftables") {
		t.Errorf("run with an unknown backend: %v", err)
	}
}

// TestBundledServicesParse checks the bundled file without root.
func TestBundledServicesParse(t *testing.T) {
	objs, err := static.Parse(bytes.NewReader(bundledServices))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Services) != 6 || len(objs.EndpointSlices) != 5 {
		t.Errorf("bundled file: %d services, %d slices; want 6, 5", len(objs.Services), len(objs.EndpointSlices))
	}
}
