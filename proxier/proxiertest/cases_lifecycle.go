package proxiertest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// otherTool is the rule set of "another program" in the node namespace:
// an nftables table with a set, a filter chain and a nat chain, none of
// which matches the suite's traffic.
const otherTool = `
table inet othertool {
	set allowed4 { type ipv4_addr; elements = { 192.0.2.99 } }
	set allowed6 { type ipv6_addr; elements = { 2001:db8:99::1 } }
	chain input {
		type filter hook input priority 10; policy accept;
		ip saddr @allowed4 counter accept
		ip6 saddr @allowed6 counter accept
	}
	chain prerouting {
		type nat hook prerouting priority -110; policy accept;
		ip daddr 192.0.2.98 tcp dport 9 dnat ip to 192.0.2.97
	}
}
`

// otherIptables are iptables rules of another program.
var otherIptables = [][]string{
	{"iptables", "-w", "-A", "INPUT", "-s", "192.0.2.99/32", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"},
	{"iptables", "-w", "-t", "nat", "-N", "OTHER-TOOL"},
	{"iptables", "-w", "-t", "nat", "-A", "OTHER-TOOL", "-d", "192.0.2.98/32", "-j", "RETURN"},
	{"iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-j", "OTHER-TOOL"},
	{"ip6tables", "-w", "-A", "INPUT", "-s", "2001:db8:99::1/128", "-j", "ACCEPT"},
}

func (e *env) exec(args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.tn.Node1.Exec(ctx, args[0], args[1:]...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

var counters = regexp.MustCompile(`counter packets \d+ bytes \d+|\[\d+:\d+\]`)

// othersState is what of the other program's rules the node holds.
func (e *env) othersState() string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table, err := e.tn.Node1.Exec(ctx, "nft", "list", "table", "inet", "othertool")
	if err != nil {
		table = fmt.Sprintf("table inet othertool is gone: %v", err)
	}
	b.WriteString(counters.ReplaceAllString(table, "counter"))
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(e.exec(save), "\n") {
			if strings.Contains(l, "OTHER-TOOL") || strings.Contains(l, "192.0.2.99") || strings.Contains(l, "2001:db8:99::1") {
				b.WriteString(counters.ReplaceAllString(l, "") + "\n")
			}
		}
	}
	return b.String()
}

// coexistence: another program's nftables table and iptables rules,
// installed before the proxier starts, survive every sync and the
// cleanup unchanged.
func coexistence(e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.tn.Node1.ExecInput(ctx, otherTool, "nft", "-f", "-"); err != nil {
		e.t.Fatal(err)
	}
	for _, cmd := range otherIptables {
		e.exec(cmd...)
	}
	want := e.othersState()
	check := func(when string) {
		e.t.Helper()
		if got := e.othersState(); got != want {
			e.t.Errorf("another program's rules changed %s:\n--- before\n%s\n--- after\n%s", when, want, got)
		}
	}
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("web", nodePorts(30080))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	check("after the first sync")
	e.reaches(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30080)), 8080, 20, p11, p21)
	other := e.service("other", ports(udpPort("dns", 53, 8081)), loadBalancer([]int32{30081}, 0), affinity(60))
	e.apply(other, e.slicesFor(other, ready(p21)))
	check("after adding a service")
	e.apply(e.slicesFor(svc, ready(p11)))
	check("after changing endpoints")
	e.remove(other, e.slicesFor(other))
	check("after deleting a service")
	e.answers(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30080)), 8080, 5, p11)
	e.stop()
	e.cleanup()
	check("after Cleanup")
	e.close()
	check("after Close")
}

// restart: established TCP connections through a cluster IP and a node
// port keep working while the proxier is stopped and closed (the
// dataplane stays), and after a new proxier starts from the same objects.
func restart(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	svc := e.service("echo", ports(tcpPort("echo", 90, int32(testnet.EchoPort)), tcpPort("http", 80, 8080)), nodePorts(30090, 30080))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.start()
	ext := e.tn.Node1.ExternalIP(e.fam)
	type conn struct {
		what string
		c    net.Conn
	}
	var conns []conn
	dials := []struct {
		from *testnet.Host
		d    dest
	}{
		{&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 90))},
		{e.node1(), tcpTo(e.clusterIP(svc, 90))},
	}
	if !e.opts.NodeOnly {
		dials = append(dials, struct {
			from *testnet.Host
			d    dest
		}{e.client(), tcpTo(addrPort(ext, 30090))})
	}
	for _, x := range dials {
		c, err := x.from.DialTCP(x.d.addr, answerTimeout)
		if err != nil {
			e.t.Fatalf("%s -> %s: %v", x.from.Name, x.d, err)
		}
		defer c.Close()
		conns = append(conns, conn{fmt.Sprintf("%s -> %s", x.from.Name, x.d), c})
	}
	echo := func(when string) {
		e.t.Helper()
		for _, c := range conns {
			if err := testnet.Echo(c.c, "line-"+strings.ReplaceAll(when, " ", "-"), answerTimeout); err != nil {
				e.t.Errorf("established connection %s %s: %v", c.what, when, err)
			}
		}
	}
	echo("before the restart")
	e.stop()
	e.close()
	echo("with the proxier stopped and closed")
	e.start()
	echo("after a new proxier started")
	e.reaches(&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80)), 8080, 20, p11, p21)
	if !e.opts.NodeOnly {
		e.answers(e.client(), tcpTo(addrPort(ext, 30080)), 8080, 5, p11, p21)
	}
	echo("after new connections")
}

// richServices applies services that exercise most of a backend's
// features, so that Cleanup has much to remove, and sends some traffic so
// that dynamic state (affinity, conntrack) exists.
func (e *env) richServices() {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	a := e.service("rich-cluster", ports(tcpPort("tcp", 80, 8080), udpPort("udp", 53, 8081), sctpPort("sctp", 7777, 8082)))
	b := e.service("rich-np", nodePorts(30087), affinity(60))
	c := e.service("rich-lb", loadBalancer([]int32{30088}, 0), sourceRanges(e.clientNet()), externalLocal(30997), externalIPs(1))
	d := e.service("rich-empty", nodePorts(30089))
	f := e.service("rich-itp", internalLocal())
	g := e.service("rich-zones")
	e.apply(a, e.slicesFor(a, ready(p11), ready(p21)),
		b, e.slicesFor(b, ready(p11), ready(p12)),
		c, e.slicesFor(c, ready(p11), ready(p21)),
		d, e.slicesFor(d),
		f, e.slicesFor(f, ready(p21)),
		g, e.slicesFor(g, ready(p11).hints(zoneA), ready(p21).hints(zoneB)))
}

func (e *env) richTraffic() {
	p11, p12, p21 := e.pod(1, 1), e.pod(1, 2), e.pod(2, 1)
	a, b := e.svcs["rich-cluster"], e.svcs["rich-np"]
	e.answers(e.node1(), tcpTo(e.clusterIP(a, 80)), 8080, 3, p11, p21)
	e.answers(&e.pod(1, 3).Host, udpTo(e.clusterIP(a, 53)), 8081, 3, p11, p21)
	e.answers(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30087)), 8080, 3, p11, p12)
	e.answers(&e.pod(1, 3).Host, tcpTo(e.clusterIP(b, 80)), 8080, 3, p11, p12)
}

// snapshot describes everything of the node namespace a backend could
// create: nftables rule set, iptables rules of both families, links,
// addresses and routes.
func (e *env) snapshot() string {
	var b strings.Builder
	section := func(name, out string) {
		fmt.Fprintf(&b, "## %s\n%s\n", name, strings.TrimSpace(out))
	}
	section("nft list ruleset", counters.ReplaceAllString(e.exec("nft", "list", "ruleset"), "counter"))
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(e.exec(save), "\n") {
			if !strings.HasPrefix(l, "#") {
				lines = append(lines, counters.ReplaceAllString(l, "[0:0]"))
			}
		}
		section(save, strings.Join(lines, "\n"))
	}
	var links []string
	for _, l := range strings.Split(e.exec("ip", "-br", "link"), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			links = append(links, f[0])
		}
	}
	section("links", strings.Join(links, "\n"))
	var addrs []string
	for _, l := range strings.Split(e.exec("ip", "-br", "addr"), "\n") {
		if f := strings.Fields(l); len(f) > 2 {
			addrs = append(addrs, f[0]+" "+strings.Join(f[2:], " "))
		}
	}
	section("addresses", strings.Join(addrs, "\n"))
	section("routes", e.exec("ip", "-4", "route", "show", "table", "all")+e.exec("ip", "-6", "route", "show", "table", "all"))
	return b.String()
}

func (e *env) sameSnapshot(before, when string) {
	e.t.Helper()
	if after := e.snapshot(); after != before {
		e.t.Errorf("the node namespace %s differs from before the proxier started:\n--- before\n%s\n--- after\n%s", when, before, after)
	}
}

// cleanupRemovesEverything: after Run returns and Cleanup, the node
// namespace holds nothing the proxier created, and the services no longer
// answer.
func cleanupRemovesEverything(e *env) {
	before := e.snapshot()
	e.richServices()
	e.start()
	e.richTraffic()
	e.stop()
	e.cleanup()
	e.sameSnapshot(before, "after Cleanup")
	e.unanswered(e.node1(), tcpTo(e.clusterIP(e.svcs["rich-cluster"], 80)))
	e.unanswered(e.client(), tcpTo(addrPort(e.tn.Node1.ExternalIP(e.fam), 30087)))
	e.close()
}

// cleanupByNewInstance: a new proxier that never ran removes what an
// earlier one (stopped and closed) created, as after a switch of
// backends or a crash.
func cleanupByNewInstance(e *env) {
	before := e.snapshot()
	e.richServices()
	e.start()
	e.richTraffic()
	e.stop()
	e.close()
	e.build()
	e.cleanup()
	e.sameSnapshot(before, "after Cleanup by a new proxier")
	e.close()
}

// cleanupOnCleanNamespace: Cleanup in a namespace the backend never
// touched succeeds and changes nothing.
func cleanupOnCleanNamespace(e *env) {
	before := e.snapshot()
	e.build()
	e.cleanup()
	e.sameSnapshot(before, "after Cleanup")
	e.close()
}

// restartServices is how many services the restart-under-load case
// programs besides its probed one, so that taking over the dataplane is
// work of some size for every backend.
const restartServices = 5000

// restartSyncTimeout bounds the first sync of 5,000 services, which
// takes a while in an emulated VM.
const restartSyncTimeout = 3 * time.Minute

// restartProbeInterval is the default of Options.RestartProbeInterval.
const restartProbeInterval = 500 * time.Microsecond

// restartNewConnections kills a proxier that holds thousands of services
// (Run stops and the proxier is closed without Cleanup, as a killed
// process leaves the kernel) and starts a new one, which takes the
// dataplane over, while new connections keep arriving from the node, a
// pod and the outside client: not one may fail, before, between or after.
func restartNewConnections(e *env) {
	p11, p21 := e.pod(1, 1), e.pod(2, 1)
	for i := range restartServices {
		s := e.service(fmt.Sprintf("bulk-%04d", i))
		e.apply(s, e.slicesFor(s, ready(p21)))
	}
	svc := e.service("probed", nodePorts(30080))
	e.apply(svc, e.slicesFor(svc, ready(p11), ready(p21)))
	e.startWithin(restartSyncTimeout)
	ext := e.tn.Node1.ExternalIP(e.fam)
	probes := []struct {
		from *testnet.Host
		d    dest
	}{
		{e.node1(), tcpTo(e.clusterIP(svc, 80))},
		{&e.pod(1, 3).Host, tcpTo(e.clusterIP(svc, 80))},
	}
	if !e.opts.NodeOnly {
		probes = append(probes, struct {
			from *testnet.Host
			d    dest
		}{e.client(), tcpTo(addrPort(ext, 30080))})
	}
	type failure struct {
		what string
		at   time.Duration
		r    testnet.Result
	}
	var (
		mu       sync.Mutex
		failures []failure
		sent     = make([]int, len(probes))
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		begin    = time.Now()
	)
	interval := restartProbeInterval
	if d := e.opts.RestartProbeInterval; d > 0 {
		interval = min(d, 20*time.Millisecond)
	}
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				r := e.probe(p.from, p.d, answerTimeout)
				mu.Lock()
				sent[i]++
				if r.Outcome != testnet.Answered || r.Port != 8080 || (r.Server != p11.Name && r.Server != p21.Name) {
					failures = append(failures, failure{fmt.Sprintf("%s -> %s", p.from.Name, p.d), time.Since(begin), r})
				}
				mu.Unlock()
			}
		}()
	}
	phase := func(what string) time.Duration {
		d := time.Since(begin)
		e.t.Logf("%v: %s", d.Round(time.Millisecond), what)
		return d
	}
	time.Sleep(300 * time.Millisecond)
	phase("killing the proxier")
	e.stop()
	e.close()
	time.Sleep(300 * time.Millisecond)
	phase("starting a new proxier")
	e.startWithin(restartSyncTimeout)
	phase("the new proxier has synced")
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	for i, p := range probes {
		// The probers ran for at least 0.9 s at 50 a second; a
		// prober that sent far fewer was stalled, not probing.
		if sent[i] < 30 {
			e.t.Errorf("%s -> %s: only %d new connections during the restart", p.from.Name, p.d, sent[i])
		}
	}
	for _, f := range failures {
		e.t.Errorf("%v after the start: %s: %v; want an answer from %s or %s on port 8080", f.at.Round(time.Millisecond), f.what, f.r, p11.Name, p21.Name)
	}
	e.t.Logf("new connections: %v per prober, %d failed", sent, len(failures))
}
