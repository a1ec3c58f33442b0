package kubeproxy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/kubeproxy"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/testnet"
)

// The test's two namespaces, joined by a veth pair:
//
//	node  veth0  10.0.0.1/24  fd00::1/64   the oracle programs it; default routes via the pod
//	pod   eth0   10.0.0.2/24  fd00::2/64   a TCP server on podPort
//
// The Service "web" has the cluster IPs 10.96.0.10 and fd00:96::10, port 80
// to the pod's podPort.
var (
	nodeIPv4, nodeIPv6 = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	podIPv4, podIPv6   = netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	vipIPv4, vipIPv6   = netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")
)

const podPort = 8080

const service = `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: PreferDualStack
  ports: [{name: http, port: 80, targetPort: 8080}]
`

const sliceV4 = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.2], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
`

const sliceV6 = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints: [{addresses: ["fd00::2"], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
`

// The phase without endpoints: the IPv4 slice emptied (an update), the
// IPv6 slice gone (a deletion).
const sliceV4Empty = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: []
ports: [{name: http, port: 8080, protocol: TCP}]
`

// TestOracle programs a namespace with kube-proxy's proxiers through the
// oracle, in both modes, dual-stack and single-stack, and checks the
// traffic: a connection to the cluster IP reaches the pod; without
// endpoints it is rejected; with the endpoints back it reaches the pod
// again. It also checks that the host's nftables tables did not change.
func TestOracle(t *testing.T) {
	testnet.RequireRoot(t)
	for _, c := range []string{"ip", "nft", "iptables-restore", "ip6tables-restore"} {
		testnet.RequireCommand(t, c)
	}
	bin := kubeproxy.RequireBinary(t)
	hostTables := nftTables(t)
	t.Cleanup(func() {
		if got := nftTables(t); got != hostTables {
			t.Errorf("the host's nftables tables changed:\nbefore:\n%s\nafter:\n%s", hostTables, got)
		}
	})

	dir := t.TempDir()
	files := map[string]string{
		"phase1.yaml": service + "---\n" + sliceV4 + "---\n" + sliceV6,
		"phase2.yaml": "# endpoints removed\n---\n" + service + "---\n" + sliceV4Empty,
		// The same objects as a List.
		"phase3.yaml": "apiVersion: v1\nkind: List\nitems:\n" + asListItems(service, sliceV4, sliceV6),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name    string
		mode    kubeproxy.Mode
		nodeIPs []netip.Addr
	}{
		{"nftables/dual-stack", kubeproxy.NFTables, []netip.Addr{nodeIPv4, nodeIPv6}},
		{"iptables/dual-stack", kubeproxy.IPTables, []netip.Addr{nodeIPv4, nodeIPv6}},
		{"nftables/IPv4", kubeproxy.NFTables, []netip.Addr{nodeIPv4}},
		{"iptables/IPv6", kubeproxy.IPTables, []netip.Addr{nodeIPv6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, pod := topology(t)
			serve(t, pod)
			var vips []netip.AddrPort
			for _, ip := range tc.nodeIPs {
				if ip.Is4() {
					vips = append(vips, netip.AddrPortFrom(vipIPv4, 80))
				} else {
					vips = append(vips, netip.AddrPortFrom(vipIPv6, 80))
				}
			}

			o := kubeproxy.New(t, node.Path(), kubeproxy.Options{
				Mode:             tc.mode,
				NodeIPs:          tc.nodeIPs,
				HostnameOverride: "node1",
				ClusterCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
				ServiceCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/108")},
				Binary:           bin,
			})
			apply := func(file string) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				start := time.Now()
				if err := o.Apply(ctx, filepath.Join(dir, file)); err != nil {
					t.Fatal(err)
				}
				t.Logf("%s synced in %v", file, time.Since(start).Round(time.Millisecond))
			}

			apply("phase1.yaml")
			for _, vip := range vips {
				expectPod(t, node, vip)
			}
			apply("phase2.yaml")
			for _, vip := range vips {
				expectRejected(t, node, vip)
			}
			apply("phase3.yaml")
			for _, vip := range vips {
				expectPod(t, node, vip)
			}

			// A file the oracle cannot read is an error, and the
			// oracle keeps working.
			if err := o.Apply(context.Background(), filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "no such file") {
				t.Errorf("Apply of a missing file: %v, want a \"no such file\" error", err)
			}
			apply("phase3.yaml")
		})
	}
}

// topology creates the node and pod namespaces with `ip netns add`,
// configures them (nothing in the caller's namespace) and removes them in
// t.Cleanup.
func topology(t *testing.T) (node, pod *netns.NS) {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	id := "pkkp-" + hex.EncodeToString(b[:])
	nodeName, podName := id+"-node", id+"-pod"
	for _, name := range []string{nodeName, podName} {
		run(t, "ip", "netns", "add", name)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", name, err, out)
			}
		})
	}
	n := func(ns string, args ...string) { run(t, append([]string{"ip", "-n", ns}, args...)...) }
	n(nodeName, "link", "set", "lo", "up")
	n(podName, "link", "set", "lo", "up")
	n(nodeName, "link", "add", "veth0", "type", "veth", "peer", "name", "eth0", "netns", podName)
	n(nodeName, "addr", "add", nodeIPv4.String()+"/24", "dev", "veth0")
	n(nodeName, "addr", "add", nodeIPv6.String()+"/64", "dev", "veth0", "nodad")
	n(podName, "addr", "add", podIPv4.String()+"/24", "dev", "eth0")
	n(podName, "addr", "add", podIPv6.String()+"/64", "dev", "eth0", "nodad")
	n(nodeName, "link", "set", "veth0", "up")
	n(podName, "link", "set", "eth0", "up")
	// Cluster IPs need a route, as on a real node; the pod answers
	// nothing sent to them that kube-proxy did not translate.
	n(nodeName, "route", "add", "default", "via", podIPv4.String())
	n(nodeName, "-6", "route", "add", "default", "via", podIPv6.String())

	open := func(name string) *netns.NS {
		h, err := netns.Open(filepath.Join(testnet.NetNSDir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	return open(nodeName), open(podName)
}

// serve runs a TCP server on the pod's addresses, port podPort, that
// writes "pod <local address>" and closes; it stops in t.Cleanup.
func serve(t *testing.T, pod *netns.NS) {
	t.Helper()
	var ls []net.Listener
	err := pod.Do(func() error {
		for _, ip := range []netip.Addr{podIPv4, podIPv6} {
			l, err := net.Listen("tcp", netip.AddrPortFrom(ip, podPort).String())
			if err != nil {
				return err
			}
			ls = append(ls, l)
		}
		return nil
	})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, l := range ls {
			l.Close()
		}
		wg.Wait()
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "pod %s\n", c.LocalAddr())
				c.Close()
			}
		})
	}
}

// dial connects from the node namespace and reads the answer.
func dial(node *netns.NS, dst netip.AddrPort) (string, error) {
	var c net.Conn
	err := node.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), 3*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func expectPod(t *testing.T, node *netns.NS, vip netip.AddrPort) {
	t.Helper()
	pod := podIPv4
	if vip.Addr().Is6() {
		pod = podIPv6
	}
	want := "pod " + netip.AddrPortFrom(pod, podPort).String()
	got, err := dial(node, vip)
	if err != nil || got != want {
		t.Errorf("connect to %s: got %q, %v; want %q", vip, got, err, want)
	}
}

func expectRejected(t *testing.T, node *netns.NS, vip netip.AddrPort) {
	t.Helper()
	got, err := dial(node, vip)
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("connect to %s without endpoints: got %q, %v; want connection refused or host unreachable (a reject)", vip, got, err)
	}
}

// nftTables lists the tables of the caller's own namespace.
func nftTables(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return string(out)
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// asListItems indents YAML documents as the items of a List.
func asListItems(docs ...string) string {
	var b strings.Builder
	for _, d := range docs {
		for i, line := range strings.Split(strings.TrimRight(d, "\n"), "\n") {
			if i == 0 {
				b.WriteString("- " + line + "\n")
			} else {
				b.WriteString("  " + line + "\n")
			}
		}
	}
	return b.String()
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}
