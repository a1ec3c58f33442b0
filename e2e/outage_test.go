package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// outage is how long the API server stays down.
const outage = 20 * time.Second

// reconverge bounds the time from the API server's restart to the daemon
// having programmed the changes written right after it. client-go's
// reflectors back off exponentially while the server is away (up to 30 s,
// with jitter), so this is longer than converge.
const reconverge = 90 * time.Second

// TestAPIServerOutage stops kube-apiserver for 20 s while traffic flows:
// the dataplane must keep working, unchanged, during the outage; the
// daemon must reconnect by itself and converge on changes written right
// after the restart.
func TestAPIServerOutage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, envOptions{})
		n1, n2 := e.tp.Node1, e.tp.Node2
		client := &n1.Pods[2].Host
		a, b, c, d := n1.Pods[0], n1.Pods[1], n2.Pods[0], n2.Pods[1]

		start := time.Now()
		keep := clusterIP(t, e.createService("keep"), model.IPv4)
		e.setEndpoints("keep", model.IPv4, a, c)
		npSvc := e.createService("np", nodePort)
		e.setEndpoints("np", model.IPv4, a, c)
		np := netip.AddrPortFrom(n1.ExternalIPv4, uint16(npSvc.Spec.Ports[0].NodePort))
		gone := clusterIP(t, e.createService("gone"), model.IPv4)
		e.setEndpoints("gone", model.IPv4, b)
		move := clusterIP(t, e.createService("move"), model.IPv4)
		e.setEndpoints("move", model.IPv4, a)
		for _, dst := range []netip.AddrPort{keep, gone, move} {
			e.reachable(t, client, dst, start, converge)
		}
		e.reachable(t, e.tp.Client, np, start, converge)
		// Let the last sync settle before taking the reference dump.
		time.Sleep(1500 * time.Millisecond)
		before := e.rules()

		down := time.Now()
		took, killed, err := e.cluster.StopAPIServer()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kube-apiserver stopped in %v (SIGKILL needed: %v)", took.Round(time.Millisecond), killed)
		if _, err := e.cs.CoreV1().Services(testNS).Get(e.ctx, "keep", metav1.GetOptions{}); err == nil {
			t.Fatal("the API server still answers")
		}
		probes, glitches := 0, 0
		for time.Since(down) < outage {
			for _, p := range []struct {
				h    *testnet.Host
				dst  netip.AddrPort
				want []string
			}{
				{client, keep, names(a, c)},
				{e.tp.Client, np, names(a, c)},
				{client, gone, names(b)},
				{client, move, names(a)},
			} {
				r, glitch := answer(t, p.h, p.dst)
				probes++
				if glitch {
					glitches++
				}
				if !slices.Contains(p.want, r.Server) {
					t.Fatalf("%v into the outage: %s → %s: %v; want an answer from %v", time.Since(down).Round(time.Millisecond), p.h.Name, p.dst, r, p.want)
				}
			}
			if e.proxy.exited() {
				t.Fatalf("the daemon exited during the outage: %v", e.proxy.err)
			}
			// Liveness must hold: a kubelet would otherwise restart
			// the daemon for an outage it cannot fix.
			if code := e.proxy.get("/livez"); code != http.StatusOK {
				t.Fatalf("%v into the outage: /livez answered %d", time.Since(down).Round(time.Millisecond), code)
			}
			time.Sleep(200 * time.Millisecond)
		}
		during := e.rules()
		if during != before {
			t.Errorf("the dataplane changed during the outage:\n--- before\n%s\n--- at its end\n%s", before, during)
		}
		t.Logf("%d probes during the %v outage, all answered by the right pods (%d on a second try); rules unchanged", probes, outage, glitches)

		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := e.cluster.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		up := time.Now()
		t.Logf("kube-apiserver back after %v down", up.Sub(down).Round(time.Millisecond))
		e.deleteService("gone")
		e.setEndpoints("move", model.IPv4, d)
		fresh := clusterIP(t, e.createService("fresh"), model.IPv4)
		e.setEndpoints("fresh", model.IPv4, c)

		dark := silentWithin(t, client, gone, up, reconverge)
		e.reachable(t, client, fresh, up, reconverge)
		waitOnlyWithin(t, client, move, up, reconverge, d.Name)
		t.Logf("converged on the changes written after the restart %v after it (deleted service dark after %v)",
			time.Since(up).Round(time.Millisecond), dark.Round(time.Millisecond))
		answeredOnlyBy(t, client, keep, 20, a.Name, c.Name)
		answeredOnlyBy(t, e.tp.Client, np, 20, a.Name, c.Name)
		if e.proxy.exited() {
			t.Fatalf("the daemon exited: %v", e.proxy.err)
		}
	})
}

// waitOnlyWithin is waitOnly with its own limit.
func waitOnlyWithin(t *testing.T, h *testnet.Host, dst netip.AddrPort, since time.Time, limit time.Duration, want string) {
	t.Helper()
	for {
		got := spread(t, h, dst, 10)
		if len(got) == 1 && got[want] == 10 {
			return
		}
		if time.Since(since) > limit {
			t.Fatalf("%s → %s: answered by %v %v after the API write; want only %s", h.Name, dst, got, limit, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// counters matches iptables-save's chain counters.
var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// rules dumps node1's packet filtering state without counters: nftables
// (every table, whoever owns it) and iptables, for the tools installed.
func (e *env) rules() string {
	e.t.Helper()
	var out []string
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	for _, cmd := range [][]string{{"nft", "-s", "list", "ruleset"}, {"iptables-save"}, {"ip6tables-save"}} {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			continue
		}
		s, err := e.tp.Node1.Exec(ctx, cmd[0], cmd[1:]...)
		if err != nil {
			e.t.Fatalf("%s in node1: %v", strings.Join(cmd, " "), err)
		}
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "#") {
				continue // iptables-save's timestamps
			}
			keep = append(keep, counters.ReplaceAllString(l, ""))
		}
		out = append(out, "### "+strings.Join(cmd, " "), strings.Join(keep, "\n"))
	}
	return strings.Join(out, "\n")
}
