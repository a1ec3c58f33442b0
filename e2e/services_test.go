package e2e

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// converge is how soon after an API write the change must show in
// traffic.
const converge = 2 * time.Second

// lbIP is the load-balancer address the test writes into a Service's
// status, from the documentation range: the client routes it via node1.
var lbIP = netip.MustParseAddr("203.0.113.100")

// TestServices runs the daemon with its default flags and walks Services
// through their life the way a cluster's users and controllers do,
// checking real traffic after every API write.
func TestServices(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, envOptions{})
		n1, n2 := e.tp.Node1, e.tp.Node2
		// node1-pod3 is the client pod; the others serve.
		client := &n1.Pods[2].Host
		a, b, c, d := n1.Pods[0], n1.Pods[1], n2.Pods[0], n2.Pods[1]

		t.Run("ClusterIP", func(t *testing.T) {
			start := time.Now()
			svc := e.createService("web")
			e.setEndpoints("web", model.IPv4, a, c)
			vip := clusterIP(t, svc, model.IPv4)
			took := e.reachable(t, client, vip, start, converge)
			t.Logf("new service %s answered %v after its creation", vip, took.Round(time.Millisecond))
			answeredOnlyBy(t, client, vip, 40, a.Name, c.Name)
			answeredOnlyBy(t, &n1.Host, vip, 40, a.Name, c.Name)

			// Scaled from 2 to 4 endpoints: load spreads over all.
			start = time.Now()
			e.setEndpoints("web", model.IPv4, a, b, c, d)
			e.reachable(t, client, vip, start, converge, b.Name, d.Name)
			got := answeredOnlyBy(t, client, vip, 80, a.Name, b.Name, c.Name, d.Name)
			t.Logf("80 connections after scaling to 4 endpoints: %v", got)

			// Scaled down to one.
			start = time.Now()
			e.setEndpoints("web", model.IPv4, d)
			waitOnly(t, client, vip, start, d.Name)

			start = time.Now()
			e.deleteService("web")
			took = silentWithin(t, client, vip, start, converge)
			t.Logf("deleted service stopped answering %v after the delete", took.Round(time.Millisecond))
		})

		t.Run("DualStack", func(t *testing.T) {
			start := time.Now()
			svc := e.createService("dual", dualStack)
			e.setEndpoints("dual", model.IPv4, a, c)
			e.setEndpoints("dual", model.IPv6, a, c)
			for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
				vip := clusterIP(t, svc, f)
				e.reachable(t, client, vip, start, converge)
				answeredOnlyBy(t, client, vip, 40, a.Name, c.Name)
			}
		})

		t.Run("OtherServiceProxyName", func(t *testing.T) {
			// Two services written at the same time: the one for
			// another proxy stays dark while ours answers.
			start := time.Now()
			other := e.createService("other", labelled("service.kubernetes.io/service-proxy-name", "other"))
			mine := e.createService("mine")
			e.setEndpoints("other", model.IPv4, a)
			e.setEndpoints("mine", model.IPv4, a)
			e.reachable(t, client, clusterIP(t, mine, model.IPv4), start, converge)
			neverAnswered(t, client, clusterIP(t, other, model.IPv4), 3*time.Second)
		})

		t.Run("NodePort", func(t *testing.T) {
			start := time.Now()
			svc := e.createService("np", nodePort)
			e.setEndpoints("np", model.IPv4, a, c)
			np := svc.Spec.Ports[0].NodePort
			if np == 0 {
				t.Fatal("the API server allocated no node port")
			}
			dst := netip.AddrPortFrom(n1.ExternalIPv4, uint16(np))
			took := e.reachable(t, e.tp.Client, dst, start, converge)
			t.Logf("node port %d answered the client %v after creation", np, took.Round(time.Millisecond))
			answeredOnlyBy(t, e.tp.Client, dst, 40, a.Name, c.Name)
		})

		t.Run("LoadBalancer", func(t *testing.T) {
			svc := e.createService("lb", loadBalancer)
			e.setEndpoints("lb", model.IPv4, a, c)
			e.reachable(t, client, clusterIP(t, svc, model.IPv4), time.Now(), converge)
			dst := netip.AddrPortFrom(lbIP, servicePort)
			if r := e.tp.Client.TCP(dst, probeTimeout); r.Outcome == testnet.Answered {
				t.Fatalf("load-balancer address answered before the status named it: %v", r)
			}
			start := time.Now()
			e.setLoadBalancerIngress("lb", lbIP)
			took := e.reachable(t, e.tp.Client, dst, start, converge)
			t.Logf("load-balancer ingress %s answered the client %v after the status patch", lbIP, took.Round(time.Millisecond))
			answeredOnlyBy(t, e.tp.Client, dst, 40, a.Name, c.Name)
		})

		t.Run("SessionAffinity", func(t *testing.T) {
			start := time.Now()
			svc := e.createService("sticky", nodePort, clientIPAffinity)
			e.setEndpoints("sticky", model.IPv4, a, b, c, d)
			vip := clusterIP(t, svc, model.IPv4)
			e.reachable(t, client, vip, start, converge)
			np := netip.AddrPortFrom(n1.ExternalIPv4, uint16(svc.Spec.Ports[0].NodePort))
			for _, p := range []struct {
				h   *testnet.Host
				dst netip.AddrPort
			}{{client, vip}, {e.tp.Client, np}} {
				if got := spread(t, p.h, p.dst, 30); len(got) != 1 {
					t.Errorf("%s → %s with ClientIP affinity reached %v, want one pod", p.h.Name, p.dst, got)
				}
			}
			// Affinity off again: connections spread.
			start = time.Now()
			e.updateService("sticky", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = nil
			})
			for deadline := start.Add(converge); ; {
				if got := spread(t, client, vip, 30); len(got) > 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s → %s: still sticky %v after affinity was turned off", client.Name, vip, converge)
				}
			}
		})

		t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
			start := time.Now()
			svc := e.createService("local", loadBalancer, externalLocal)
			e.setEndpoints("local", model.IPv4, a, c)
			e.setLoadBalancerIngress("local", lbIP.Next())
			np := netip.AddrPortFrom(n1.ExternalIPv4, uint16(svc.Spec.Ports[0].NodePort))
			lb := netip.AddrPortFrom(lbIP.Next(), servicePort)
			e.reachable(t, e.tp.Client, lb, start, converge)
			for _, dst := range []netip.AddrPort{np, lb} {
				// Only node1's endpoint, with the client's own
				// address: no masquerade, no second hop.
				for range 20 {
					r, _ := answer(t, e.tp.Client, dst)
					if r.Server != a.Name || r.Source.Addr() != e.tp.Client.IPv4 {
						t.Fatalf("client → %s (Local): %v; want %s seeing %s", dst, r, a.Name, e.tp.Client.IPv4)
					}
				}
			}
			// Cluster IP traffic still reaches every endpoint.
			answeredOnlyBy(t, client, clusterIP(t, svc, model.IPv4), 40, a.Name, c.Name)

			// The health check node port tells load balancers that
			// node1 has one local endpoint.
			hc := netip.AddrPortFrom(n1.ExternalIPv4, uint16(svc.Spec.HealthCheckNodePort))
			if svc.Spec.HealthCheckNodePort == 0 {
				t.Fatal("the API server allocated no health check node port")
			}
			var code int
			var body string
			var err error
			for deadline := time.Now().Add(converge); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if code, body, err = httpGet(e.tp.Client, hc, "/healthz", time.Second); err == nil && code == 200 {
					break
				}
			}
			var hb struct{ LocalEndpoints int }
			if err != nil || code != 200 || json.Unmarshal([]byte(body), &hb) != nil || hb.LocalEndpoints != 1 {
				t.Fatalf("health check node port %s: %d %q %v; want 200 with localEndpoints 1", hc, code, body, err)
			}

			// No endpoint left on node1: node1 drops external traffic
			// instead of sending it to node2.
			start = time.Now()
			e.setEndpoints("local", model.IPv4, c)
			silentWithin(t, e.tp.Client, np, start, converge)
			if code, body, err := httpGet(e.tp.Client, hc, "/healthz", time.Second); err != nil || code != 503 {
				t.Errorf("health check node port %s without local endpoints: %d %q %v; want 503", hc, code, body, err)
			}
		})
	})
}

// waitOnly waits until probes from h to dst are answered only by want,
// within converge of since.
func waitOnly(t *testing.T, h *testnet.Host, dst netip.AddrPort, since time.Time, want string) {
	t.Helper()
	for {
		got := spread(t, h, dst, 10)
		if len(got) == 1 && got[want] == 10 {
			return
		}
		if time.Since(since) > converge {
			t.Fatalf("%s → %s: answered by %v %v after the API write; want only %s", h.Name, dst, got, converge, want)
		}
	}
}
