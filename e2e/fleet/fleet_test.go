package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testcluster"
	"github.com/proxykit/proxykit/internal/testnet"
)

// The environment of TestFleet.
const (
	// EnvNodes is the number of nodes; unset, TestFleet skips.
	EnvNodes = "PROXYKIT_FLEET_NODES"
	// EnvServices is the number of Services, each with one
	// EndpointSlice; default 1000.
	EnvServices = "PROXYKIT_FLEET_SERVICES"
	// EnvChurn is how long the writes go on, a Go duration; default 2m.
	EnvChurn = "PROXYKIT_FLEET_CHURN"
	// EnvRate is the number of writes per second; default 10.
	EnvRate = "PROXYKIT_FLEET_RATE"
	// EnvConntrackCleanup, set to 1, keeps the proxiers' conntrack
	// cleanup after each sync, which TestFleet turns off by default: every
	// node namespace shares this one kernel's conntrack table, and each
	// cleanup dumps it whole (the kernel walks every namespace's entries
	// to find its own), so with it N proxiers measure that table, N times,
	// rather than the API server. See the package comment.
	EnvConntrackCleanup = "PROXYKIT_FLEET_CONNTRACK_CLEANUP"
	// EnvProfile is a directory where the first node's proxier writes
	// its CPU profile (fleet-000.cpu, from its start to the end of the
	// test), for `go tool pprof`.
	EnvProfile = "PROXYKIT_FLEET_PROFILE"
	// EnvStagger is the time over which the proxiers start, one after
	// another at even intervals, a Go duration; default 30s, the
	// proxiers' full resync period, so that their periodic full resyncs
	// are spread as independent nodes' would be (0: all at once, as after
	// a cluster-wide restart; their full resyncs then coincide).
	EnvStagger = "PROXYKIT_FLEET_STAGGER"
	// EnvCSV is a file to write every (write, node) pair's figures to:
	// write, kind, its time from the churn's start, node, delivery and
	// programming latency (ms, empty when not seen).
	EnvCSV = "PROXYKIT_FLEET_CSV"
	// EnvMinSync is every proxier's minimum interval between syncs, a Go
	// duration; default 1s (kube-proxy's and examples/proxy's default
	// minSyncPeriod).
	EnvMinSync = "PROXYKIT_FLEET_MIN_SYNC"
)

// Fixed parameters.
const (
	fleetNS = "fleet" // the Kubernetes namespace of the Services
	// manifest holds the RBAC the proxiers run with.
	manifest = "../../examples/proxy/deploy/daemonset.yaml"
	portName = "http"
	// servicePorts are the two ports a Service write moves between.
	servicePortA, servicePortB = 80, 81
	// writers create the initial objects concurrently.
	writers = 16
	// syncLimit bounds the wait for every proxier's first sync.
	syncLimit = 10 * time.Minute
	// sampleEvery is the interval of the resident memory samples.
	sampleEvery = 5 * time.Second
)

// svcState is what the test last wrote for one Service.
type svcState struct {
	mu    sync.Mutex // guards svc and slice, replaced by a write's goroutine
	svc   *v1.Service
	slice *discoveryv1.EndpointSlice
	ip    netip.Addr
	pod   int // index into pods: the endpoint's pod
}

// endpoint is a pod an EndpointSlice can point at: node1-pod1 or
// node2-pod1, at the same addresses in every node's topology.
type endpoint struct {
	name string
	ip   netip.Addr
}

// TestFleet runs N proxier processes, each programming its own node
// namespace from one kube-apiserver, while Services and EndpointSlices
// churn, and reports network programming latency over all nodes, the API
// server's CPU time and watch count, and each proxier's resident memory
// (issue #22's "50 nodes on one API server"). See the package comment;
// it skips unless PROXYKIT_FLEET_NODES is set.
func TestFleet(t *testing.T) {
	p := params(t)
	testcluster.RequireBinaries(t)
	testnet.RequireRoot(t)
	t.Logf("FLEET loadavg at start: %s", loadavg())
	t.Cleanup(func() { t.Logf("FLEET loadavg at end: %s", loadavg()) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// Node namespaces first: every topology has the same pod addresses.
	began := time.Now()
	nodes := make([]*node, p.nodes)
	for i := range nodes {
		nodes[i] = &node{i: i, name: fmt.Sprintf("fleet-%03d", i), kick: make(chan struct{}, 1), awaiting: map[string]*write{},
			tp: buildTopology(t)}
	}
	pods := []endpoint{
		{nodes[0].tp.Node1.Pods[0].Name, nodes[0].tp.Node1.Pods[0].IPv4},
		{nodes[0].tp.Node2.Pods[0].Name, nodes[0].tp.Node2.Pods[0].IPv4},
	}
	t.Logf("FLEET %d node topologies (%d namespaces each) built in %v", p.nodes, len(nodes[0].tp.Namespaces()), time.Since(began).Round(time.Millisecond))

	cluster := testcluster.Start(t, testcluster.Options{})
	cs := adminClient(t, cluster)
	kubeconfig := cluster.ManifestKubeconfig(t, manifest)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleetNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{v1.LabelHostname: n.name, v1.LabelOSStable: "linux"}},
			Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.tp.Node1.IPv4.String()}}},
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	began = time.Now()
	state := createServices(t, ctx, cs, p.services, pods, nodes)
	t.Logf("FLEET wrote %d Services and %d EndpointSlices in %v", p.services, p.services, time.Since(began).Round(time.Millisecond))

	// The proxiers, spread over p.stagger.
	idle := apiMetrics(t, ctx, cs)
	began = time.Now()
	synced := newSyncWait(state, pods, len(nodes))
	for _, n := range nodes {
		time.Sleep(time.Until(began.Add(time.Duration(n.i) * p.stagger / time.Duration(len(nodes)))))
		cp := childParams{Kubeconfig: kubeconfig, NodeName: n.name, NetNS: n.tp.Node1.Path(), MinSync: p.minSync,
			ConntrackCleanup: os.Getenv(EnvConntrackCleanup) == "1"}
		if dir := os.Getenv(EnvProfile); dir != "" && n.i == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			cp.CPUProfile = filepath.Join(dir, n.name+".cpu")
		}
		n.start(t, cp)
		synced.watch(n)
	}
	var loops sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(ctx)
	loopErrs := make(chan error, 2*len(nodes))
	for _, n := range nodes {
		loops.Add(2)
		go func() { defer loops.Done(); loopErrs <- n.watchGenerations(loopCtx) }()
		go func() { defer loops.Done(); loopErrs <- n.probeLoop(loopCtx) }()
	}
	// Before the topologies' teardown (registered earlier, run later),
	// which fails on a socket left in a namespace.
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopLoops()
			loops.Wait()
		}
	}
	t.Cleanup(stop)
	firstSync := synced.wait(t)
	t.Logf("FLEET every proxier, started over %v, programmed the %d Services %v after the first started (per node from its start: median %v, max %v)",
		p.stagger, p.services, time.Since(began).Round(time.Millisecond), pct(firstSync, 50).Round(time.Millisecond), pct(firstSync, 100).Round(time.Millisecond))

	// Churn.
	api, etcd := cluster.APIServerPID(), cluster.EtcdPID()
	mem := &memSampler{nodes: nodes}
	beforeMetrics := apiMetrics(t, ctx, cs)
	before := cpuTimes(nodes, api, etcd)
	selfBefore := cpuTime(os.Getpid())
	mem.sample()
	stopMem := mem.run(sampleEvery)
	churnStart := time.Now()
	writes := churn(t, ctx, cs, p, state, pods, nodes)
	churnTime := time.Since(churnStart)
	during := apiMetrics(t, ctx, cs)
	after := cpuTimes(nodes, api, etcd)
	selfCPU := cpuTime(os.Getpid()) - selfBefore
	stopMem()
	mem.sample()

	// Let the last writes arrive everywhere.
	drain := time.Now().Add(observeLimit + 2*pollInterval)
	for time.Now().Before(drain) {
		left := 0
		for _, n := range nodes {
			left += n.unprogrammed()
		}
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	for range 2 * len(nodes) {
		if err := <-loopErrs; err != nil {
			t.Error(err)
		}
	}
	warnings, firstWarning := 0, ""
	for _, n := range nodes {
		if n.exited() {
			t.Errorf("proxier of %s exited: %v; log:\n%s", n.name, n.exitErr, tail(n.logPath, 30))
		}
		b, _ := os.ReadFile(n.logPath)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				warnings++
				if firstWarning == "" {
					firstWarning = n.name + ": " + l
				}
			}
		}
	}
	t.Logf("FLEET proxier warnings and errors logged: %d (first: %q)", warnings, firstWarning)
	if path := os.Getenv(EnvCSV); path != "" {
		if err := writeCSV(path, writes, nodes, churnStart); err != nil {
			t.Error(err)
		}
	}
	r := summarize(writes, nodes, churnStart, churnStart.Add(churnTime))
	r.nodes, r.services, r.rate, r.minSync, r.stagger = p.nodes, p.services, p.rate, p.minSync, p.stagger
	r.churn, r.firstSync = churnTime, firstSync
	r.apiCPU, r.etcdCPU, r.selfCPU = after.api-before.api, after.etcd-before.etcd, selfCPU
	r.proxierCPU = make([]time.Duration, len(nodes))
	for i := range nodes {
		r.proxierCPU[i] = after.nodes[i] - before.nodes[i]
	}
	r.idle, r.before, r.during = idle, beforeMetrics, during
	r.rss, r.hwm = mem.final()
	r.apiRSS, r.apiHWM = usage(api)
	r.log(t)
	for _, w := range writes {
		if w.err != nil {
			t.Errorf("write %d (%s %s): %v", w.id, w.kind, w.key, w.err)
		}
	}
	if r.lost > 0 {
		t.Errorf("%d of %d (write, node) pairs were not programmed within %v", r.lost, len(writes)*len(nodes), observeLimit)
	}
}

// buildTopology builds a node's topology and registers its teardown. It
// tries up to three times: on a loaded machine the kernel is at times
// slow to make the IPv6 addresses of a new namespace usable, and
// testnet.Build gives up after 20 s.
func buildTopology(t *testing.T) *testnet.Topology {
	t.Helper()
	var err error
	for range 3 {
		var tp *testnet.Topology
		if tp, err = testnet.Build(testnet.Options{Node1Pods: 1, Node2Pods: 1}); err == nil {
			t.Cleanup(func() {
				if err := tp.Close(); err != nil {
					t.Errorf("testnet teardown: %v", err)
				}
			})
			return tp
		}
		t.Logf("%v; again", err)
	}
	t.Fatal(err)
	return nil
}

// fleetParams are TestFleet's sizes.
type fleetParams struct {
	nodes, services, rate   int
	churn, minSync, stagger time.Duration
}

// params reads the sizes from the environment, or skips the test.
func params(t *testing.T) fleetParams {
	t.Helper()
	v := os.Getenv(EnvNodes)
	if v == "" {
		t.Skipf("opt-in measurement (N proxier processes, minutes): set %s=N, e.g. sudo %s=50 go test ./e2e/fleet/ -run TestFleet -v -timeout 30m", EnvNodes, EnvNodes)
	}
	p := fleetParams{services: 1000, rate: 10, churn: 2 * time.Minute, minSync: time.Second, stagger: 30 * time.Second}
	var err error
	if p.nodes, err = strconv.Atoi(v); err != nil || p.nodes < 1 || p.nodes > 200 {
		t.Fatalf("%s=%q: want a number of nodes from 1 to 200", EnvNodes, v)
	}
	for _, e := range []struct {
		name string
		to   *int
	}{{EnvServices, &p.services}, {EnvRate, &p.rate}} {
		if v := os.Getenv(e.name); v != "" {
			if *e.to, err = strconv.Atoi(v); err != nil || *e.to < 1 {
				t.Fatalf("%s=%q: want a positive number", e.name, v)
			}
		}
	}
	for _, e := range []struct {
		name string
		to   *time.Duration
	}{{EnvChurn, &p.churn}, {EnvMinSync, &p.minSync}, {EnvStagger, &p.stagger}} {
		if v := os.Getenv(e.name); v != "" {
			if *e.to, err = time.ParseDuration(v); err != nil || *e.to < 0 || *e.to == 0 && e.name != EnvStagger {
				t.Fatalf("%s=%q: want a positive Go duration", e.name, v)
			}
		}
	}
	// A Service is written again only after every node had its chance
	// to show the previous write.
	if p.services < p.rate*int(observeLimit/time.Second) {
		t.Fatalf("%d Services at %d writes/s would write a Service again within %v: want at least %d", p.services, p.rate, observeLimit, p.rate*int(observeLimit/time.Second))
	}
	if p.services > 30000 {
		t.Fatalf("%s=%d: at most 30000 (the service CIDR)", EnvServices, p.services)
	}
	return p
}

// adminClient returns an admin clientset without a client-side rate
// limit, speaking protobuf.
func adminClient(t *testing.T, c *testcluster.Cluster) kubernetes.Interface {
	t.Helper()
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = -1, 1000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// createServices creates n ClusterIP Services with one EndpointSlice
// each, of one endpoint alternating between the two pods, with writers
// concurrent writers.
func createServices(t *testing.T, ctx context.Context, cs kubernetes.Interface, n int, pods []endpoint, nodes []*node) []*svcState {
	t.Helper()
	state := make([]*svcState, n)
	next := make(chan int)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				st, err := createService(ctx, cs, i, pods, nodes[i%len(nodes)].name)
				if err != nil {
					errs <- err
					for range next {
					}
					return
				}
				state[i] = st
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return state
}

func createService(ctx context.Context, cs kubernetes.Interface, i int, pods []endpoint, nodeName string) (*svcState, error) {
	name := fmt.Sprintf("svc-%05d", i)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: fleetNS, Name: name, Labels: map[string]string{"app.kubernetes.io/name": name}},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeClusterIP,
			Selector: map[string]string{"app.kubernetes.io/name": name},
			Ports: []v1.ServicePort{{Name: portName, Protocol: v1.ProtocolTCP, Port: servicePortA,
				TargetPort: intstr.FromInt32(int32(testnet.ServerPorts[0]))}},
		},
	}
	got, err := cs.CoreV1().Services(fleetNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create Service %s: %w", name, err)
	}
	ip, err := netip.ParseAddr(got.Spec.ClusterIP)
	if err != nil {
		return nil, fmt.Errorf("Service %s: cluster IP %q: %w", name, got.Spec.ClusterIP, err)
	}
	st := &svcState{svc: got, ip: ip, pod: i % len(pods)}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: fleetNS, Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(int32(testnet.ServerPorts[0])), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	setEndpoint(sl, pods[st.pod], nodeName)
	if st.slice, err = cs.DiscoveryV1().EndpointSlices(fleetNS).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create EndpointSlice of %s: %w", name, err)
	}
	return st, nil
}

// setEndpoint makes pod the slice's one endpoint.
func setEndpoint(sl *discoveryv1.EndpointSlice, pod endpoint, nodeName string) {
	sl.Endpoints = []discoveryv1.Endpoint{{
		Addresses:  []string{pod.ip.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To(nodeName),
	}}
}

// syncWait waits for every proxier's first sync: a node counts once it
// answers a sample of the Services (every len/20th and the last) from
// their pods. Each node is probed every 100 ms on a goroutine of its own,
// from its start.
type syncWait struct {
	sample   []*svcState
	pods     []endpoint
	deadline time.Time
	took     []time.Duration // per node, from its start
	errs     chan error
}

func newSyncWait(state []*svcState, pods []endpoint, nodes int) *syncWait {
	w := &syncWait{pods: pods, deadline: time.Now().Add(syncLimit), took: make([]time.Duration, nodes), errs: make(chan error, nodes)}
	step := max(1, len(state)/20)
	for i := 0; i < len(state); i += step {
		w.sample = append(w.sample, state[i])
	}
	w.sample = append(w.sample, state[len(state)-1])
	return w
}

// watch probes n from now on until it has synced.
func (w *syncWait) watch(n *node) {
	go func() {
		for {
			if n.exited() {
				w.errs <- fmt.Errorf("proxier of %s exited before it synced: %v; log:\n%s", n.name, n.exitErr, tail(n.logPath, 30))
				return
			}
			ok := true
			for _, st := range w.sample {
				if n.probe(netip.AddrPortFrom(st.ip, servicePortA)) != w.pods[st.pod].name {
					ok = false
					break
				}
			}
			if ok {
				w.took[n.i] = time.Since(n.started)
				w.errs <- nil
				return
			}
			if time.Now().After(w.deadline) {
				w.errs <- fmt.Errorf("proxier of %s did not program the Services within %v", n.name, syncLimit)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// wait returns each node's time to its first sync, once all have synced.
func (w *syncWait) wait(t *testing.T) []time.Duration {
	t.Helper()
	for range w.took {
		if err := <-w.errs; err != nil {
			t.Fatal(err)
		}
	}
	return w.took
}

// churn writes p.rate times per second for p.churn (whole seconds):
// every fifth write
// moves a Service's port (80 <-> 81), the others move an EndpointSlice's
// endpoint to the other pod. The Services are taken in a random order,
// round robin. Each write is sent on its own goroutine at its tick and
// registered with every node before it is sent.
func churn(t *testing.T, ctx context.Context, cs kubernetes.Interface, p fleetParams, state []*svcState, pods []endpoint, nodes []*node) []*write {
	t.Helper()
	order := rand.New(rand.NewPCG(22, 50)).Perm(len(state))
	var (
		writes []*write
		wg     sync.WaitGroup
	)
	// Write i is due at start + i/rate: a late write goes out at once and
	// the next ones keep their times, so the rate holds on a busy machine.
	start := time.Now()
	for i := 0; i < p.rate*int(p.churn/time.Second); i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(p.rate))))
		st := state[order[i%len(order)]]
		w := &write{id: i, delivered: make([]time.Duration, len(nodes)), programmed: make([]time.Duration, len(nodes))}
		var send func() error
		st.mu.Lock()
		svc, sl := st.svc.DeepCopy(), st.slice.DeepCopy()
		st.mu.Unlock()
		if i%5 == 4 {
			port := int32(servicePortA)
			if svc.Spec.Ports[0].Port == servicePortA {
				port = servicePortB
			}
			svc.Spec.Ports[0].Port = port
			w.kind, w.key = "svc", fleetNS+"/"+svc.Name
			w.dst, w.pod = netip.AddrPortFrom(st.ip, uint16(port)), pods[st.pod].name
			send = func() error {
				got, err := cs.CoreV1().Services(fleetNS).Update(ctx, svc, metav1.UpdateOptions{})
				if err == nil {
					st.mu.Lock()
					st.svc = got
					st.mu.Unlock()
				}
				return err
			}
		} else {
			st.pod = 1 - st.pod
			setEndpoint(sl, pods[st.pod], *sl.Endpoints[0].NodeName)
			w.kind, w.key = "slice", fleetNS+"/"+sl.Name
			w.dst, w.pod = netip.AddrPortFrom(st.ip, uint16(svc.Spec.Ports[0].Port)), pods[st.pod].name
			send = func() error {
				got, err := cs.DiscoveryV1().EndpointSlices(fleetNS).Update(ctx, sl, metav1.UpdateOptions{})
				if err == nil {
					st.mu.Lock()
					st.slice = got
					st.mu.Unlock()
				}
				return err
			}
		}
		w.t0 = time.Now()
		for _, n := range nodes {
			n.expect(w)
		}
		writes = append(writes, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.err = send()
			w.api = time.Since(w.t0)
		}()
	}
	wg.Wait()
	return writes
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pct returns the p-th percentile (nearest rank) of ds; 0 if empty.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(k, 0), len(s)-1)]
}
