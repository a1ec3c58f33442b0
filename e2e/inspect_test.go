package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// TestDebugServices checks what the running daemon shows of what it
// programmed, with Services from the API server: /debug/services reads
// every frontend back from node1's kernel and finds it as the Services
// ask (externalTrafficPolicy Local split between the local endpoint and,
// for pods and the node, every endpoint), and `proxy inspect --kernel`
// reads the same kernel without the daemon's help.
func TestDebugServices(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, envOptions{})
		n1, n2 := e.tp.Node1, e.tp.Node2
		client := &n1.Pods[2].Host
		a, c := n1.Pods[0], n2.Pods[0]

		start := time.Now()
		web := e.createService("web")
		e.setEndpoints("web", model.IPv4, a, c)
		e.createService("local", loadBalancer, externalLocal)
		e.setEndpoints("local", model.IPv4, a, c)
		e.setLoadBalancerIngress("local", lbIP)
		e.reachable(t, client, clusterIP(t, web, model.IPv4), start, converge)
		e.reachable(t, e.tp.Client, netip.AddrPortFrom(lbIP, servicePort), start, converge, a.Name)

		epA := netip.AddrPortFrom(a.IPv4, uint16(targetPort)).String()
		epC := netip.AddrPortFrom(c.IPv4, uint16(targetPort)).String()
		var r proxier.Report
		// The LB address is in the report once the daemon synced the
		// status: wait for a report without differences.
		var problems []string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			r, problems = debugServices(t, e.proxy)
			lb := frontend(r, "e2e/local:http/TCP", proxier.KindLoadBalancer)
			if len(problems) == 0 && lb != nil {
				if !slices.Equal(lb.Endpoints, []string{epA}) || !slices.Equal(lb.SomeSources, []string{epC}) || lb.Verdict != "" {
					t.Errorf("load-balancer frontend %+v, want %s for every source and %s for pods and the node", *lb, epA, epC)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/debug/services: %s", strings.Join(problems, "\n"))
			}
		}
		if f := frontend(r, "e2e/web:http/TCP", proxier.KindClusterIP); f == nil || !slices.Equal(f.Endpoints, []string{epA, epC}) {
			t.Errorf("cluster IP frontend of web: %+v", f)
		}

		out, err := exec.Command(proxyBinary(t), "inspect", "--kernel", "--proxy-mode="+backend, "--netns="+n1.Path()).CombinedOutput()
		want := clusterIP(t, web, model.IPv4).String()
		if err != nil || !strings.Contains(string(out), strings.Replace(want, ":", " tcp/", 1)+" -> "+epA+" "+epC) {
			t.Errorf("proxy inspect --kernel (%v), want the cluster IP %s:\n%s", err, want, out)
		}
	})
}

// debugServices fetches the daemon's /debug/services as JSON and lists
// what is wrong in it: a family not read, a frontend that differs, one
// nothing claims, a service port not programmed.
func debugServices(t *testing.T, d *daemon) (proxier.Report, []string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + d.metrics + "/debug/services?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r proxier.Report
	if err := json.Unmarshal(body, &r); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("/debug/services: %s %v\n%s", resp.Status, err, body)
	}
	var problems []string
	for _, fr := range r.Families {
		if fr.Error != "" {
			problems = append(problems, fr.Family+": "+fr.Error)
		}
		for _, sr := range fr.Services {
			if sr.Error != "" {
				problems = append(problems, sr.Service+": "+sr.Error)
			}
			for _, f := range sr.Frontends {
				if !f.Read || f.Diff != "" {
					problems = append(problems, sr.Service+" "+string(f.Kind)+": "+f.Diff)
				}
			}
		}
		for _, u := range fr.Unclaimed {
			problems = append(problems, "unclaimed "+u.String())
		}
	}
	return r, problems
}

// frontend returns the wanted frontend of kind of the IPv4 service port
// named service, nil when there is none.
func frontend(r proxier.Report, service string, kind proxier.FrontendKind) *proxier.FrontendJSON {
	for _, fr := range r.Families {
		if fr.Family != model.IPv4.String() {
			continue
		}
		for _, sr := range fr.Services {
			if sr.Service != service {
				continue
			}
			for _, f := range sr.Frontends {
				if f.Kind == kind {
					return &f.Want
				}
			}
		}
	}
	return nil
}
