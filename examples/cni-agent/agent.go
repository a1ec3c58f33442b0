package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/sandbox"
)

// The agent's services.
var (
	webIP   = netip.MustParseAddr("10.96.0.10")
	adminIP = netip.MustParseAddr("10.96.0.20")
)

const (
	flushTimeout = 15 * time.Second
	probeTimeout = time.Second
)

// run is the agent: it builds the sandbox, proxies for one pod with its
// own events and its own table, and checks every step with traffic.
func run(ctx context.Context, out io.Writer) (err error) {
	sb, err := sandbox.New(ctx, sandbox.Options{Node1Pods: 2, Node2Pods: 1})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sb.Close()) }()
	pod, peer, remote := sb.Node1.Pods[0], sb.Node1.Pods[1], sb.Node2.Pods[0]
	fmt.Fprintf(out, "sandbox pk-%s; the agent proxies for pod %s (%s) inside its network namespace\n", sb.ID, pod.Name, pod.IPv4)

	// 1. The agent's own rules, before and independent of the proxier.
	if err := addPolicy(pod, remote.IPv4, 8082); err != nil {
		return fmt.Errorf("agent table: %w", err)
	}
	fmt.Fprintf(out, "1. agent table %q: egress policy rejects TCP to %s:8082 (%s)\n", "inet "+agentTable, remote.IPv4, remote.Name)

	// 2. The proxier, in the pod's namespace, fed by the agent.
	cfg := nftables.Config{Config: proxier.Config{
		NetNS:           pod.NetNSPath(),
		NodeName:        sb.Node1.Name,
		Families:        []model.IPFamily{model.IPv4},
		MinSyncInterval: 50 * time.Millisecond,
	}}
	web, admin := service("web", webIP, 8080), service("admin", adminIP, 8082)
	webSlice, adminSlice := slice("web", 8080, peer, remote), slice("admin", 8082, remote)
	// feed delivers the agent's current objects to a new proxier.
	feed := func(p proxier.Proxier) {
		p.OnServiceAdd(web)
		p.OnServiceAdd(admin)
		p.OnEndpointSliceAdd(webSlice)
		p.OnEndpointSliceAdd(adminSlice)
		p.OnServiceSynced()
		p.OnEndpointSlicesSynced()
	}
	r, err := start(ctx, cfg, feed)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.stop(false)) }()
	fmt.Fprintf(out, "2. proxier running in %s's namespace; the agent delivered 2 Services and 2 EndpointSlices\n", pod.Name)
	webVIP := netip.AddrPortFrom(webIP, 80)
	if err := check(out, "web "+webVIP.String()+" → "+peer.Name+", "+remote.Name, answers(pod, webVIP, peer.Name, remote.Name)); err != nil {
		return err
	}
	// The agent's policy sees the packet after the proxier's DNAT (output
	// hook, filter priority 0, after nat -100), so it applies to the
	// endpoint behind a service too.
	if err := check(out, "admin "+adminIP.String()+":80 → "+remote.Name+":8082 refused by the policy", refused(pod, netip.AddrPortFrom(adminIP, 80))); err != nil {
		return err
	}
	if err := check(out, "direct "+remote.IPv4.String()+":8080 allowed", answers(pod, netip.AddrPortFrom(remote.IPv4, 8080), remote.Name)); err != nil {
		return err
	}

	// 3. An event of the agent's own: the peer pod stopped being ready.
	next := slice("web", 8080, remote)
	r.p.OnEndpointSliceUpdate(webSlice, next)
	if err := r.flush(ctx); err != nil {
		return err
	}
	webSlice = next
	fmt.Fprintf(out, "3. agent event: %s is not ready any more\n", peer.Name)
	if err := check(out, "web "+webVIP.String()+" only "+remote.Name, answers(pod, webVIP, remote.Name)); err != nil {
		return err
	}

	// 4. Both tables live side by side.
	tables, err := listTables(pod)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "4. tables in %s's namespace: %s\n", pod.Name, strings.Join(tables, ", "))
	if !slices.Contains(tables, "inet "+agentTable) || !slices.Contains(tables, "ip "+nftables.DefaultTableName) {
		return fmt.Errorf("want both the agent's and proxykit's table, have %v", tables)
	}

	// 5. A restart: a new proxier adopts its table in one transaction; the
	// agent's table is not touched.
	if err := r.stop(false); err != nil {
		return err
	}
	if r, err = start(ctx, cfg, feed); err != nil {
		return err
	}
	fmt.Fprintln(out, "5. the proxier restarted (the agent fed the new one its current objects) and replaced its own table")
	if err := check(out, "web "+webVIP.String()+" still "+remote.Name, answers(pod, webVIP, remote.Name)); err != nil {
		return err
	}
	if err := check(out, "the agent's policy still rejects", refused(pod, netip.AddrPortFrom(remote.IPv4, 8082))); err != nil {
		return err
	}

	// 6. Cleanup removes proxykit's table only.
	if err := r.stop(true); err != nil {
		return err
	}
	if tables, err = listTables(pod); err != nil {
		return err
	}
	hits, err := policyHits(pod)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "6. after the proxier's Cleanup: %s (the agent's rule rejected %d packets so far)\n", strings.Join(tables, ", "), hits)
	if !slices.Equal(tables, []string{"inet " + agentTable}) {
		return fmt.Errorf("after Cleanup want only the agent's table, have %v", tables)
	}
	return check(out, "the agent's policy still rejects", refused(pod, netip.AddrPortFrom(remote.IPv4, 8082)))
}

// running is a started proxier.
type running struct {
	p       proxier.Proxier
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// start builds a proxier, lets feed deliver the agent's objects, runs it
// and waits until it has programmed them.
func start(ctx context.Context, cfg nftables.Config, feed func(proxier.Proxier)) (*running, error) {
	p, err := nftables.New(cfg)
	if err != nil {
		return nil, err
	}
	feed(p)
	rctx, cancel := context.WithCancel(ctx)
	r := &running{p: p, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(rctx) }()
	if err := r.flush(ctx); err != nil {
		return nil, errors.Join(err, r.stop(true))
	}
	return r, nil
}

func (r *running) flush(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	return r.p.Flush(fctx)
}

// stop stops the proxier and closes it, after removing its table when
// cleanup is set. Stopping twice does nothing.
func (r *running) stop(cleanup bool) error {
	if r.stopped {
		return nil
	}
	r.stopped = true
	r.cancel()
	err := <-r.done
	if cleanup {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = errors.Join(err, r.p.Cleanup(ctx))
		cancel()
	}
	return errors.Join(err, r.p.Close())
}

func service(name string, ip netip.Addr, target int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "agent", Name: name},
		Spec: v1.ServiceSpec{ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(target)}}},
	}
}

func slice(svc string, port int32, pods ...*sandbox.Pod) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "agent", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IPv4.String()},
			NodeName: ptr.To(p.Node.Name), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// answers sends requests from pod to dst and checks that exactly the
// pods want answer: every answer from one of them, each of them seen.
func answers(pod *sandbox.Pod, dst netip.AddrPort, want ...string) error {
	got := map[string]bool{}
	for i := range 32 {
		r := pod.TCP(dst, probeTimeout)
		if r.Outcome != sandbox.Answered {
			return fmt.Errorf("%s: %v", dst, r)
		}
		if !slices.Contains(want, r.Server) {
			return fmt.Errorf("%s: answered by %s, want %v", dst, r.Server, want)
		}
		got[r.Server] = true
		if len(got) == len(want) && i+1 >= 4*len(want) {
			return nil
		}
	}
	return fmt.Errorf("%s: answered by %d of %v", dst, len(got), want)
}

// refused checks that a connection from pod to dst is refused.
func refused(pod *sandbox.Pod, dst netip.AddrPort) error {
	if r := pod.TCP(dst, probeTimeout); !r.Outcome.Rejected() {
		return fmt.Errorf("%s: %v, want refused", dst, r)
	}
	return nil
}

// check prints one verified claim.
func check(out io.Writer, what string, err error) error {
	if err != nil {
		fmt.Fprintf(out, "   %-60s FAILED: %v\n", what, err)
		return fmt.Errorf("%s: %w", what, err)
	}
	fmt.Fprintf(out, "   %-60s ok\n", what)
	return nil
}
