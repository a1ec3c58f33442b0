package healthcheck_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/healthcheck"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestServiceServersInNamespace opens health check servers inside a
// node namespace and queries them from the outside client over the link.
func TestServiceServersInNamespace(t *testing.T) {
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	ns, err := netns.Open(tp.Node1.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	healthy := true
	s := healthcheck.NewServiceServers(ns, nil, func() bool { return healthy }, nil)
	defer s.Close()

	web := model.ServiceName{Namespace: "demo", Name: "web"}
	if err := s.Sync(map[model.ServiceName]healthcheck.ServiceHealth{web: {Port: 32000, LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	get := func(f model.IPFamily) (int, map[string]any, error) {
		dst := netip.AddrPortFrom(tp.Node1.ExternalIP(f), 32000)
		client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
			DialContext: func(context.Context, string, string) (net.Conn, error) {
				return tp.Client.DialTCP(dst, 2*time.Second)
			},
		}}
		resp, err := client.Get("http://" + dst.String() + "/")
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return resp.StatusCode, nil, err
		}
		return resp.StatusCode, body, nil
	}
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		code, body, err := get(f)
		if err != nil {
			t.Fatalf("%v: %v", f, err)
		}
		if code != http.StatusOK || body["localEndpoints"] != float64(2) {
			t.Fatalf("%v: got %d %v, want 200 with localEndpoints 2", f, code, body)
		}
		if svc, _ := body["service"].(map[string]any); svc["name"] != "web" || svc["namespace"] != "demo" {
			t.Fatalf("%v: body names %v", f, body["service"])
		}
	}
	// No local endpoint: 503.
	if err := s.Sync(map[model.ServiceName]healthcheck.ServiceHealth{web: {Port: 32000}}); err != nil {
		t.Fatal(err)
	}
	if code, body, err := get(model.IPv4); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("no local endpoints: got %d %v %v, want 503", code, body, err)
	}
	// Proxier unhealthy: 503 even with endpoints.
	healthy = false
	if err := s.Sync(map[model.ServiceName]healthcheck.ServiceHealth{web: {Port: 32000, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if code, body, err := get(model.IPv4); err != nil || code != http.StatusServiceUnavailable || body["serviceProxyHealthy"] != false {
		t.Fatalf("unhealthy proxier: got %d %v %v, want 503", code, body, err)
	}
	// Service gone: the port closes.
	if err := s.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(model.IPv4); err == nil {
		t.Fatal("server still answers after its service left")
	}
}

// TestServiceServersOnNodePortAddresses: with NodePortAddresses, the
// servers listen only on the namespace's addresses in them.
func TestServiceServersOnNodePortAddresses(t *testing.T) {
	tp := testnet.New(t, testnet.Options{Node1Pods: 1, Node2Pods: 1})
	ns, err := netns.Open(tp.Node1.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ext4, ext6 := tp.Node1.ExternalIP(model.IPv4), tp.Node1.ExternalIP(model.IPv6)
	addrs, err := healthcheck.AddrsIn(ns, []netip.Prefix{netip.PrefixFrom(ext4, 32), netip.PrefixFrom(ext6, 128)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{ext4, ext6}; len(addrs) != 2 || addrs[0] != want[0] || addrs[1] != want[1] {
		t.Fatalf("AddrsIn = %v, want %v", addrs, want)
	}
	if none, err := healthcheck.AddrsIn(ns, []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}); err != nil || len(none) != 0 {
		t.Fatalf("AddrsIn of a foreign prefix = %v, %v; want none", none, err)
	}
	s := healthcheck.NewServiceServers(ns, addrs, func() bool { return true }, nil)
	defer s.Close()
	web := model.ServiceName{Namespace: "demo", Name: "web"}
	if err := s.Sync(map[model.ServiceName]healthcheck.ServiceHealth{web: {Port: 32000, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{ext4, ext6} {
		c, err := tp.Client.DialTCP(netip.AddrPortFrom(a, 32000), 2*time.Second)
		if err != nil {
			t.Errorf("%s: %v", a, err)
			continue
		}
		c.Close()
	}
	internal := tp.Node1.IP(model.IPv4) // a node address outside the prefixes
	if c, err := tp.Client.DialTCP(netip.AddrPortFrom(internal, 32000), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("%s:32000 accepted a connection; only the NodePortAddresses may", internal)
	}
}
