package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/sandbox"

	"github.com/proxykit/proxykit/model"
)

// listEvents returns the events.k8s.io/v1 events of every namespace:
// kube-proxy's Node events go to "default", a Service's to its own.
func listEvents(t *testing.T, client kubernetes.Interface) []eventsv1.Event {
	t.Helper()
	l, err := client.EventsV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// findEvent returns the event of reason, or nil.
func findEvent(evs []eventsv1.Event, reason string) *eventsv1.Event {
	for i := range evs {
		if evs[i].Reason == reason {
			return &evs[i]
		}
	}
	return nil
}

// checkNodeEvent checks that e is kube-proxy's event about node: its
// type, reason, action and note, the Node referenced as kube-proxy does,
// and kube-proxy's reporting controller and instance.
func checkNodeEvent(t *testing.T, e *eventsv1.Event, node, eventType, reason, note string) {
	t.Helper()
	if e == nil {
		t.Errorf("no %s event", reason)
		return
	}
	host, _ := os.Hostname()
	wantRef := v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node}
	if e.Type != eventType || e.Action != "StartKubeProxy" || e.Note != note {
		t.Errorf("%s: type %q action %q note %q; want %q %q %q", reason, e.Type, e.Action, e.Note, eventType, "StartKubeProxy", note)
	}
	if e.Regarding != wantRef || e.Related != nil {
		t.Errorf("%s: regarding %+v related %v; want %+v, none", reason, e.Regarding, e.Related, wantRef)
	}
	if e.ReportingController != "kube-proxy" || e.ReportingInstance != "kube-proxy-"+host {
		t.Errorf("%s: reporting %q %q; want kube-proxy, kube-proxy-%s", reason, e.ReportingController, e.ReportingInstance, host)
	}
	if e.Namespace != metav1.NamespaceDefault || !strings.HasPrefix(e.Name, node+".") || e.EventTime.IsZero() {
		t.Errorf("%s: namespace %q name %q eventTime %v", reason, e.Namespace, e.Name, e.EventTime)
	}
}

// TestEventRecorder checks the recorder against a fake clientset: each
// of kube-proxy's Node events is written through events.k8s.io/v1 with
// kube-proxy's fields, stop waits for them, and an event after stop is
// dropped.
func TestEventRecorder(t *testing.T) {
	client := fake.NewClientset()
	log := slog.New(slog.NewTextHandler(testLog{t}, nil))
	r := newEventRecorder(client, "node-a", log)
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	bind := errors.New("bind: address already in use")
	r.starting()
	r.ipvsDeprecation()
	r.serverFailed(&serverError{what: serverHealthz, addr: "0.0.0.0:10256", err: bind})
	r.serverFailed(&serverError{what: serverMetrics, addr: "127.0.0.1:10249", err: bind})
	r.serviceHealthFailed(model.ServiceName{Namespace: "web", Name: "lb"}, 32000, bind)
	r.stop()
	r.starting() // dropped: stopped

	evs := listEvents(t, client)
	if len(evs) != 5 {
		t.Errorf("%d events, want 5: %+v", len(evs), evs)
	}
	// On the Service, as kube-proxy's healthcheck package records it.
	if ev := findEvent(evs, "FailedToStartServiceHealthcheck"); ev == nil {
		t.Error("no FailedToStartServiceHealthcheck event")
	} else if ev.Namespace != "web" || ev.Type != v1.EventTypeWarning || ev.Action != "Listen" || ev.Regarding.Kind != "Service" ||
		ev.Regarding.Namespace != "web" || ev.Regarding.Name != "lb" ||
		ev.Note != `node node-a failed to start healthcheck "web/lb" on port 32000: bind: address already in use` {
		t.Errorf("service event: %+v", ev)
	}
	checkNodeEvent(t, findEvent(evs, "Starting"), "node-a", v1.EventTypeNormal, "Starting", "")
	checkNodeEvent(t, findEvent(evs, "IPVSDeprecation"), "node-a", v1.EventTypeWarning, "IPVSDeprecation",
		"The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.")
	checkNodeEvent(t, findEvent(evs, "FailedToStartProxierHealthcheck"), "node-a", v1.EventTypeWarning, "FailedToStartProxierHealthcheck",
		"healthz server failed: failed to start proxy healthz on 0.0.0.0:10256: bind: address already in use")
	checkNodeEvent(t, findEvent(evs, "FailedToStartMetricServer"), "node-a", v1.EventTypeWarning, "FailedToStartMetricServer",
		"bind: address already in use")
}

// TestServerHardFail checks that, with hard-fail, a server whose address
// is taken fails with a *serverError whose event note is kube-proxy's
// text, and that without it the server retries instead.
func TestServerHardFail(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	log := slog.New(slog.NewTextHandler(testLog{t}, nil))
	listenErr := fmt.Sprintf("listen tcp %s: bind: address already in use", addr)
	for what, want := range map[string]string{
		serverHealthz: "healthz server failed: failed to start proxy healthz on " + addr + ": " + listenErr,
		serverMetrics: listenErr,
	} {
		srv := &server{what: what, addr: addr, hardFail: true, log: log}
		_, err := srv.start(t.Context())
		var se *serverError
		if !errors.As(err, &se) {
			t.Fatalf("%s: %v, want a *serverError", what, err)
		}
		if got := se.kubeProxyText(); got != want {
			t.Errorf("%s: note %q, want %q", what, got, want)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := &server{what: serverMetrics, addr: addr, log: log}
	if a, err := srv.start(ctx); a != nil || err != nil {
		t.Errorf("without hard-fail: %v %v, want a retry", a, err)
	}
}

// TestBindHardFailEvent runs the daemon with --bind-address-hard-fail
// and the healthz, then the metrics address taken: the run fails, and
// leaves kube-proxy's Warning event about the Node with the listen
// error, and no Starting event.
func TestBindHardFailEvent(t *testing.T) {
	sandbox.RequirePrivilege(t)
	tp, err := sandbox.New(t.Context(), sandbox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Error(err)
		}
	})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	listenErr := fmt.Sprintf("listen tcp %s: bind: address already in use", addr)
	for _, tc := range []struct {
		server, healthz, metrics, reason, note string
	}{
		{serverHealthz, addr, fmt.Sprintf("127.0.0.1:%d", freePort(t)), "FailedToStartProxierHealthcheck",
			"healthz server failed: failed to start proxy healthz on " + addr + ": " + listenErr},
		{serverMetrics, fmt.Sprintf("127.0.0.1:%d", freePort(t)), addr, "FailedToStartMetricServer", listenErr},
	} {
		t.Run(tc.server, func(t *testing.T) {
			file := writeConfigFile(t, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
bindAddressHardFail: true
healthzBindAddress: %s
metricsBindAddress: %s
conntrack:
  maxPerCore: 0
`, tc.healthz, tc.metrics))
			client := fake.NewClientset(&v1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: tp.Node1.Name},
				Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: tp.Node1.ExternalIPv4.String()}}},
			})
			s, err := resolve([]string{"--config", file, "--hostname-override", tp.Node1.Name, "--netns", tp.Node1.NetNSPath()}, testLog{t})
			if err != nil {
				t.Fatal(err)
			}
			d := &daemon{s: s, client: client, nodeName: tp.Node1.Name}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err = d.run(ctx)
			var se *serverError
			if !errors.As(err, &se) || se.what != tc.server {
				t.Fatalf("run: %v, want the %s server's failure", err, tc.server)
			}
			evs := listEvents(t, client)
			checkNodeEvent(t, findEvent(evs, tc.reason), tp.Node1.Name, v1.EventTypeWarning, tc.reason, tc.note)
			if e := findEvent(evs, "Starting"); e != nil {
				t.Errorf("a run that failed to start sent Starting: %+v", e)
			}
		})
	}
}
