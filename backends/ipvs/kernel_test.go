package ipvs

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	mipvs "github.com/moby/ipvs"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Kernel tests: a real IPVS table in the node namespace of a testnet
// topology. They need IPVS and the dummy driver (hack/vmtest.sh runs them
// in a VM when the host lacks them).

const probeTimeout = 3 * time.Second

// kernelEnv is a topology with a backend of family f in node1.
type kernelEnv struct {
	t   *testing.T
	tn  *testnet.Topology
	fam model.IPFamily
}

func newKernelEnv(t *testing.T, f model.IPFamily) *kernelEnv {
	t.Helper()
	requireIPVS(t)
	return &kernelEnv{t: t, tn: testnet.New(t, testnet.Options{}), fam: f}
}

// backend builds a backend in node1 (closed at the end of the test).
func (e *kernelEnv) backend(cfg Config) *backend {
	e.t.Helper()
	cfg.NetNS = e.tn.Node1.Path()
	cfg.ClusterCIDRs = []netip.Prefix{testnet.PodNetwork(e.fam)}
	b, err := NewBackend(cfg, e.fam)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { b.Close() })
	return b.(*backend)
}

func (e *kernelEnv) sync(b *backend, req *proxier.SyncRequest) {
	e.t.Helper()
	if err := b.Sync(e.t.Context(), req); err != nil {
		e.t.Fatalf("sync: %+v", err)
	}
}

// vip returns a cluster IP of the case's family.
func (e *kernelEnv) vip(n int) string {
	if e.fam == model.IPv6 {
		return "fd00:10:96::" + strconv.Itoa(n)
	}
	return "10.96.0." + strconv.Itoa(n)
}

// ep returns the endpoint of a pod at port.
func (e *kernelEnv) ep(p *testnet.Pod, port uint16) string {
	return netip.AddrPortFrom(p.IP(e.fam), port).String()
}

// kernelDests returns the real servers of a virtual server.
func (e *kernelEnv) kernelDests(b *backend, k vsKey) map[netip.AddrPort]kernelDest {
	e.t.Helper()
	ds, err := b.ipvs.dests(k)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[netip.AddrPort]kernelDest{}
	for _, d := range ds {
		out[d.Addr] = d
	}
	return out
}

func key(addr string, p model.Protocol, port uint16) vsKey {
	return vsKey{netip.MustParseAddr(addr), p, port}
}

func families(t *testing.T, fn func(t *testing.T, f model.IPFamily)) {
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			fn(t, f)
		})
	}
}

// TestKernelGracefulTermination: a removed TCP real server keeps weight 0
// while a connection through it lasts and is deleted at its deadline; a
// removed UDP one is deleted at once.
func TestKernelGracefulTermination(t *testing.T) {
	families(t, func(t *testing.T, f model.IPFamily) {
		e := newKernelEnv(t, f)
		b := e.backend(Config{GracefulTerminationTimeout: time.Hour})
		clock := time.Now()
		b.now = func() time.Time { return clock }
		p11, p21, from := e.tn.Node1.Pods[0], e.tn.Node2.Pods[0], e.tn.Node1.Pods[2]
		echo := clusterSvc("echo", model.TCP, e.vip(1), 90, e.ep(p11, testnet.EchoPort), e.ep(p21, testnet.EchoPort))
		dns := clusterSvc("dns", model.UDP, e.vip(1), 53, e.ep(p11, 8081), e.ep(p21, 8081))
		e.sync(b, request(f, []svc{echo, dns}))

		vip := netip.MustParseAddr(e.vip(1))
		c, err := from.DialTCP(netip.AddrPortFrom(vip, 90), probeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := testnet.Echo(c, "before", probeTimeout); err != nil {
			t.Fatal(err)
		}
		k := key(e.vip(1), model.TCP, 90)
		var victim, other netip.AddrPort
		for a, d := range e.kernelDests(b, k) {
			if d.Conns > 0 {
				victim = a
			} else {
				other = a
			}
		}
		if !victim.IsValid() || !other.IsValid() {
			t.Fatalf("cannot tell which real server has the connection: %v", e.kernelDests(b, k))
		}

		// The endpoint holding the connection goes away.
		echo2 := echo.WithTargets(eps(other.String()), eps(other.String()), true)
		dns2 := dns.WithTargets(eps(e.ep(p21, 8081)), eps(e.ep(p21, 8081)), true)
		e.sync(b, request(f, []svc{echo2, dns2}, echo.Port.Name, dns.Port.Name))
		ds := e.kernelDests(b, k)
		if d, ok := ds[victim]; !ok || d.Weight != 0 {
			t.Errorf("removed TCP real server %s: %+v (present %v), want weight 0 while draining", victim, d, ok)
		}
		if d := ds[other]; d.Weight != 1 {
			t.Errorf("remaining real server %s has weight %d", other, d.Weight)
		}
		if err := testnet.Echo(c, "while draining", probeTimeout); err != nil {
			t.Errorf("established connection broke when its endpoint was removed: %v", err)
		}
		udp := e.kernelDests(b, key(e.vip(1), model.UDP, 53))
		if _, ok := udp[netip.MustParseAddrPort(e.ep(p11, 8081))]; ok || len(udp) != 1 {
			t.Errorf("UDP real servers after removal: %v; want only %s", udp, e.ep(p21, 8081))
		}

		// A sync with nothing changed before the deadline keeps it; after
		// it, deletes it.
		e.sync(b, request(f, []svc{echo2, dns2}, []model.ServicePortName{}...))
		if _, ok := e.kernelDests(b, k)[victim]; !ok {
			t.Error("draining real server deleted before its deadline while it has a connection")
		}
		clock = clock.Add(time.Hour + time.Second)
		e.sync(b, request(f, []svc{echo2, dns2}, echo.Port.Name))
		if _, ok := e.kernelDests(b, k)[victim]; ok {
			t.Error("draining real server not deleted after its deadline")
		}
		if len(b.draining) != 0 {
			t.Errorf("draining: %v", b.draining)
		}

		// Re-adding the endpoint brings it back with weight 1.
		e.sync(b, request(f, []svc{echo, dns}, echo.Port.Name, dns.Port.Name))
		if d := e.kernelDests(b, k)[victim]; d.Weight != 1 {
			t.Errorf("re-added real server: %+v", d)
		}
	})
}

// TestKernelRestartAdopts: a new backend adopts what an earlier one
// programmed without recreating it (the virtual servers' connection
// counters go on), removes what is no longer wanted, and leaves another
// program's virtual server alone.
func TestKernelRestartAdopts(t *testing.T) {
	families(t, func(t *testing.T, f model.IPFamily) {
		e := newKernelEnv(t, f)
		p11, p21, from := e.tn.Node1.Pods[0], e.tn.Node2.Pods[0], e.tn.Node1.Pods[2]
		web := clusterSvc("web", model.TCP, e.vip(1), 80, e.ep(p11, 8080), e.ep(p21, 8080)).With(func(sp *model.ServicePort) { sp.NodePort = 30080 })
		old := clusterSvc("old", model.TCP, e.vip(2), 80, e.ep(p11, 8080))
		a := e.backend(Config{})
		e.sync(a, request(f, []svc{web, old}))
		vip := netip.AddrPortFrom(netip.MustParseAddr(e.vip(1)), 80)
		for range 5 {
			if r := from.TCP(vip, probeTimeout); r.Outcome != testnet.Answered {
				t.Fatalf("probe %s: %v", vip, r)
			}
		}
		// Another program's virtual server.
		foreignAddr := "192.0.2.250"
		if f == model.IPv6 {
			foreignAddr = "2001:db8:2::250"
		}
		foreign := key(foreignAddr, model.TCP, 80)
		if err := a.ipvs.create(&vsSpec{Key: foreign, Sched: "rr"}); err != nil {
			t.Fatal(err)
		}
		link, _ := a.links.find()
		// IPVS refreshes its counters every 2 s (later under load).
		var before uint32
		for deadline := time.Now().Add(15 * time.Second); before < 5 && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
			before = connCount(t, a.ipvs.h, vip)
		}
		if before < 5 {
			t.Fatalf("virtual server counted %d connections, want at least 5", before)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}

		b := e.backend(Config{})
		e.sync(b, request(f, []svc{web}))
		if after := connCount(t, b.ipvs.h, vip); after < before {
			t.Errorf("virtual server %s was recreated: %d connections counted before the restart, %d after", vip, before, after)
		}
		kvs, err := b.ipvs.list()
		if err != nil {
			t.Fatal(err)
		}
		var keys []vsKey
		for _, k := range kvs {
			keys = append(keys, k.Key)
		}
		if slices.Contains(keys, key(e.vip(2), model.TCP, 80)) {
			t.Error("the virtual server of a service gone during the restart survived")
		}
		if !slices.Contains(keys, foreign) {
			t.Error("another program's virtual server was deleted")
		}
		if l, _ := b.links.find(); l == nil || l.Attrs().Index != link.Attrs().Index {
			t.Error("the dummy interface was recreated")
		}
		if r := from.TCP(vip, probeTimeout); r.Outcome != testnet.Answered {
			t.Errorf("probe %s after the restart: %v", vip, r)
		}

		// Cleanup removes everything of ours, twice without error, and
		// leaves the other program's virtual server.
		for range 2 {
			if err := b.Cleanup(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		kvs, _ = b.ipvs.list()
		if len(kvs) != 1 || kvs[0].Key != foreign {
			t.Errorf("after Cleanup the IPVS table holds %v; want only %v", kvs, foreign)
		}
		if l, _ := b.links.find(); l != nil {
			t.Error("Cleanup left the dummy interface")
		}
		for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
			fi := newFamily(f, DefaultTableName)
			if left, err := b.nft.c.TableExists(t.Context(), fi.table.proto, fi.table.name); err != nil || left {
				t.Errorf("Cleanup left the %s table (%v)", f, err)
			}
		}
		if err := b.ipvs.remove(foreign); err != nil {
			t.Fatal(err)
		}
	})
}

func connCount(t *testing.T, h *mipvs.Handle, vip netip.AddrPort) uint32 {
	t.Helper()
	svcs, err := dumpServices(h)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		if a, ok := netip.AddrFromSlice(s.Address); ok && a.Unmap() == vip.Addr() && s.Port == vip.Port() {
			return s.Stats.Connections
		}
	}
	t.Fatalf("no virtual server %s", vip)
	return 0
}

// TestKernelOtherPortsOfServiceAddressesRejected: a service address
// reaches only the service's ports; a host service listening on every
// address is reachable on the node's address, not through the cluster
// IP (the known hole of IPVS mode).
func TestKernelOtherPortsOfServiceAddressesRejected(t *testing.T) {
	families(t, func(t *testing.T, f model.IPFamily) {
		e := newKernelEnv(t, f)
		b := e.backend(Config{})
		p11, from := e.tn.Node1.Pods[0], e.tn.Node1.Pods[2]
		e.sync(b, request(f, []svc{clusterSvc("web", model.TCP, e.vip(1), 80, e.ep(p11, 8080))}))
		var l net.Listener
		if err := e.tn.Node1.Do(func() error {
			var err error
			l, err = net.Listen("tcp", ":2222")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		dial := func(a netip.Addr) error {
			return from.Do(func() error {
				c, err := net.DialTimeout("tcp", netip.AddrPortFrom(a, 2222).String(), 2*time.Second)
				if err == nil {
					c.Close()
				}
				return err
			})
		}
		if err := dial(e.tn.Node1.IP(f)); err != nil {
			t.Fatalf("host service on the node's address: %v", err)
		}
		if err := dial(netip.MustParseAddr(e.vip(1))); err == nil {
			t.Error("host service reachable through the cluster IP")
		}
		if r := from.TCP(netip.AddrPortFrom(netip.MustParseAddr(e.vip(1)), 80), probeTimeout); r.Outcome != testnet.Answered {
			t.Errorf("service port: %v", r)
		}
	})
}

// TestKernelSchedulers: every scheduler is accepted by the kernel and
// balances traffic.
func TestKernelSchedulers(t *testing.T) {
	e := newKernelEnv(t, model.IPv4)
	p11, p21, from := e.tn.Node1.Pods[0], e.tn.Node2.Pods[0], e.tn.Node1.Pods[2]
	s := clusterSvc("web", model.TCP, e.vip(1), 80, e.ep(p11, 8080), e.ep(p21, 8080))
	for _, sched := range Schedulers() {
		b := e.backend(Config{Scheduler: sched, StrictARP: true})
		e.sync(b, request(model.IPv4, []svc{s}))
		kvs, err := b.ipvs.list()
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != 1 || kvs[0].Sched != string(sched) {
			t.Errorf("%s: kernel holds %+v", sched, kvs)
		}
		if r := from.TCP(netip.AddrPortFrom(netip.MustParseAddr(e.vip(1)), 80), probeTimeout); r.Outcome != testnet.Answered {
			t.Errorf("%s: %v", sched, r)
		}
		if err := b.Cleanup(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	if v, err := e.tn.Node1.Sysctl("net/ipv4/conf/all/arp_ignore"); err != nil || v != "1" {
		t.Errorf("StrictARP: arp_ignore=%q (%v)", v, err)
	}
}

// TestKernelServiceScheduler: a service's scheduler (annotation
// proxykit.io/scheduler) overrides the proxier's in the kernel, a change
// of it is applied by an incremental sync, and an unknown one falls back
// to the proxier's.
func TestKernelServiceScheduler(t *testing.T) {
	e := newKernelEnv(t, model.IPv4)
	p11, p21, from := e.tn.Node1.Pods[0], e.tn.Node2.Pods[0], e.tn.Node1.Pods[2]
	b := e.backend(Config{})
	base := clusterSvc("web", model.TCP, e.vip(1), 80, e.ep(p11, 8080), e.ep(p21, 8080))
	for i, c := range []struct{ annotated, want string }{{"sh", "sh"}, {"mh", "mh"}, {"", "rr"}, {"fifo", "rr"}} {
		s := base.With(func(sp *model.ServicePort) { sp.Scheduler = c.annotated })
		req := request(model.IPv4, []svc{s})
		req.Full = i == 0
		e.sync(b, req)
		kvs, err := b.ipvs.list()
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != 1 || kvs[0].Sched != c.want {
			t.Errorf("scheduler %q: kernel holds %+v, want scheduler %s", c.annotated, kvs, c.want)
		}
		if r := from.TCP(netip.AddrPortFrom(netip.MustParseAddr(e.vip(1)), 80), probeTimeout); r.Outcome != testnet.Answered {
			t.Errorf("scheduler %q: %v", c.annotated, r)
		}
	}
}

// TestKernelDumpWhileOtherNamespacesChange: the kernel resumes a dump of
// virtual servers at a position counted over every namespace's entries,
// so changes in another namespace during a dump make it skip entries of
// this one. list (and Inspect) read whole tables anyway: 2,000 IPv6
// virtual servers in node1, read 20 times while node2 adds and removes
// its own as fast as it can.
func TestKernelDumpWhileOtherNamespacesChange(t *testing.T) {
	requireIPVS(t)
	tn := testnet.New(t, testnet.Options{})
	open := func(n *testnet.NS) *mipvs.Handle {
		h, err := mipvs.New(n.Path())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Close)
		return h
	}
	h1, h2 := open(tn.Node1.NS), open(tn.Node2.NS)
	t1 := &ipvsTable{h: h1, fam: model.IPv6}
	t2 := &ipvsTable{h: h2, fam: model.IPv6}
	const n = 2000
	want := make([]vsKey, 0, n)
	for i := range n {
		k := key(netip.AddrFrom16([16]byte{0: 0xfd, 5: 0x10, 7: 0x96, 14: byte(i >> 8), 15: byte(i)}).String(), model.TCP, 80)
		if err := t1.create(&vsSpec{Key: k, Sched: DefaultScheduler}); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	slices.SortFunc(want, compareKeys)

	stop := make(chan struct{})
	churned := make(chan int)
	go func() {
		ops := 0
		defer func() { churned <- ops }()
		for round := 0; ; round++ {
			for i := range 50 {
				k := key(netip.AddrFrom16([16]byte{0: 0xfd, 5: 0x20, 13: byte(round), 14: byte(i >> 8), 15: byte(i)}).String(), model.TCP, 80)
				select {
				case <-stop:
					return
				default:
				}
				if err := t2.create(&vsSpec{Key: k, Sched: DefaultScheduler}); err != nil {
					t.Error(err)
					return
				}
				ops++
			}
			kvs, err := t2.list()
			if err != nil {
				t.Error(err)
				return
			}
			for _, k := range kvs {
				if err := t2.remove(k.Key); err != nil {
					t.Error(err)
					return
				}
				ops++
			}
		}
	}()
	rawShort := 0
	for range 20 {
		raw, err := h1.GetServices()
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) < n {
			rawShort++
		}
		kvs, err := t1.list()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]vsKey, 0, len(kvs))
		for _, k := range kvs {
			got = append(got, k.Key)
		}
		if !slices.Equal(got, want) {
			missing := 0
			for _, k := range want {
				if _, found := slices.BinarySearchFunc(got, k, compareKeys); !found {
					missing++
				}
			}
			t.Errorf("list returned %d virtual servers (%d of the %d missing) while another namespace changed its own", len(got), missing, n)
		}
	}
	close(stop)
	t.Logf("node2 made %d changes; %d of 20 single dumps of node1 came back short", <-churned, rawShort)
}
