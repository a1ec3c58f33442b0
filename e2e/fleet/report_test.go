package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuTime returns the user + system CPU time of a process.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ... utime stime: fields 14 and 15.
	rp := bytes.LastIndexByte(b, ')')
	if rp < 0 {
		return 0
	}
	f := strings.Fields(string(b[rp+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * clockTick
}

// usage returns a process's VmRSS and VmHWM in kB.
func usage(pid int) (rssKB, hwmKB int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		switch k {
		case "VmRSS":
			rssKB = n
		case "VmHWM":
			hwmKB = n
		}
	}
	return rssKB, hwmKB
}

// cpu is the CPU time of the API server, etcd and each proxier at one
// moment.
type cpu struct {
	api, etcd time.Duration
	nodes     []time.Duration
}

func cpuTimes(nodes []*node, api, etcd int) cpu {
	c := cpu{api: cpuTime(api), etcd: cpuTime(etcd), nodes: make([]time.Duration, len(nodes))}
	for i, n := range nodes {
		c.nodes[i] = cpuTime(n.cmd.Process.Pid)
	}
	return c
}

// memSampler samples every proxier's VmRSS.
type memSampler struct {
	nodes []*node
	mu    sync.Mutex
	rss   [][]int // per node, kB
}

func (m *memSampler) sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rss == nil {
		m.rss = make([][]int, len(m.nodes))
	}
	for i, n := range m.nodes {
		if r, _ := usage(n.cmd.Process.Pid); r > 0 {
			m.rss[i] = append(m.rss[i], r)
		}
	}
}

// run samples every interval until the returned function is called.
func (m *memSampler) run(interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				m.sample()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// final returns, per proxier, the median of its VmRSS samples and its
// VmHWM now, in kB.
func (m *memSampler) final() (rss, hwm []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, n := range m.nodes {
		s := slices.Sorted(slices.Values(m.rss[i]))
		if len(s) > 0 {
			rss = append(rss, s[len(s)/2])
		}
		_, h := usage(n.cmd.Process.Pid)
		hwm = append(hwm, h)
	}
	return rss, hwm
}

// metrics are sums over the API server's /metrics.
type metrics struct {
	// watches is apiserver_longrunning_requests{verb="WATCH"} (the open
	// watch requests; kube-apiserver 1.36 has no
	// apiserver_registered_watchers) summed, and byResource per
	// resource.
	watches    float64
	byResource map[string]float64
	// watchEvents and watchBytes are apiserver_watch_events_total and
	// apiserver_watch_events_sizes_sum of Services and EndpointSlices:
	// every event sent to a watcher of them, and its size.
	watchEvents, watchBytes float64
}

// apiMetrics reads the API server's metrics (as admin).
func apiMetrics(t *testing.T, ctx context.Context, cs kubernetes.Interface) metrics {
	t.Helper()
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Errorf("API server metrics: %v", err)
		return metrics{}
	}
	var m metrics
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		l := s.Text()
		name, rest, ok := strings.Cut(l, "{")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "apiserver_longrunning_requests":
			if label(labels, "verb") == "WATCH" {
				m.watches += v
				if m.byResource == nil {
					m.byResource = map[string]float64{}
				}
				m.byResource[label(labels, "resource")] += v
			}
		case "apiserver_watch_events_total":
			if churned(labels) {
				m.watchEvents += v
			}
		case "apiserver_watch_events_sizes_sum":
			if churned(labels) {
				m.watchBytes += v
			}
		}
	}
	return m
}

// churned reports whether a series is of Services or EndpointSlices.
func churned(labels string) bool {
	r := label(labels, "resource")
	return r == "services" || r == "endpointslices"
}

// label returns the value of label k in a Prometheus label list.
func label(labels, k string) string {
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, k+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// report is TestFleet's outcome.
type report struct {
	nodes, services, rate   int
	minSync, churn, stagger time.Duration
	writes                  int
	// programmed and delivered are over every (write, node) pair seen;
	// first and last per write, its fastest and slowest node; api the
	// writes' request times.
	programmed, delivered, first, last, api []time.Duration
	// synced is, per (write, node) pair, the time from the write to the
	// end of the proxier's first sync that began after it received the
	// write; partial and full are the durations of its syncs during the
	// churn (the backend's Sync).
	synced, partial, full []time.Duration
	lost                  int
	gens                  int // nf_tables generations seen
	firstSync             []time.Duration
	apiCPU, etcdCPU       time.Duration
	// selfCPU is the test process's: the writes, probes and monitors.
	selfCPU    time.Duration
	proxierCPU []time.Duration
	// idle is before the proxiers started.
	idle, before, during metrics
	rss, hwm             []int
	apiRSS, apiHWM       int
}

// summarize collects the latencies of the writes.
func summarize(writes []*write, nodes []*node, from, to time.Time) *report {
	r := &report{writes: len(writes)}
	for _, n := range nodes {
		n.mu.Lock()
		for _, s := range n.syncs {
			if s.end.Before(from) || s.end.After(to) {
				continue
			}
			if s.full {
				r.full = append(r.full, s.took)
			} else {
				r.partial = append(r.partial, s.took)
			}
		}
		n.mu.Unlock()
	}
	for _, w := range writes {
		if w.err != nil {
			continue
		}
		r.api = append(r.api, w.api)
		var mine []time.Duration
		for i := range nodes {
			if d := w.programmed[i]; d > 0 {
				r.programmed = append(r.programmed, d)
				mine = append(mine, d)
			}
			if d := w.delivered[i]; d > 0 {
				r.delivered = append(r.delivered, d)
				if end, ok := nodes[i].syncAfter(w.t0.Add(d)); ok {
					r.synced = append(r.synced, end.Sub(w.t0))
				}
			}
		}
		if len(mine) > 0 {
			r.first = append(r.first, slices.Min(mine))
			r.last = append(r.last, slices.Max(mine))
		}
	}
	for _, n := range nodes {
		n.mu.Lock()
		r.lost += len(n.lost)
		r.gens += n.gens
		n.mu.Unlock()
	}
	return r
}

// writeCSV writes every (write, node) pair's figures to path.
func writeCSV(path string, writes []*write, nodes []*node, churnStart time.Time) error {
	var b strings.Builder
	b.WriteString("write,kind,at_s,node,delivered_ms,programmed_ms\n")
	ms := func(d time.Duration) string {
		if d <= 0 {
			return ""
		}
		return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64)
	}
	for _, w := range writes {
		for i, n := range nodes {
			fmt.Fprintf(&b, "%d,%s,%.3f,%s,%s,%s\n", w.id, w.kind, w.t0.Sub(churnStart).Seconds(), n.name, ms(w.delivered[i]), ms(w.programmed[i]))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// syncAfter returns the end of the node's first sync that began after at.
func (n *node) syncAfter(at time.Time) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, _ := slices.BinarySearchFunc(n.syncs, at, func(s syncRecord, t time.Time) int { return s.end.Compare(t) })
	for ; i < len(n.syncs); i++ {
		if s := n.syncs[i]; s.end.Add(-s.took).After(at) {
			return s.end, true
		}
	}
	return time.Time{}, false
}

// stats formats the median, p90, p99 and max of ds.
func stats(ds []time.Duration) string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) }
	return fmt.Sprintf("median=%sms p90=%sms p99=%sms max=%sms n=%d", ms(pct(ds, 50)), ms(pct(ds, 90)), ms(pct(ds, 99)), ms(pct(ds, 100)), len(ds))
}

// mbStats formats the median and max of kB values in MB.
func mbStats(kb []int) string {
	s := slices.Sorted(slices.Values(kb))
	if len(s) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("median=%.1fMB max=%.1fMB", float64(s[len(s)/2])/1024, float64(s[len(s)-1])/1024)
}

// log writes the report as FLEET lines.
func (r *report) log(t *testing.T) {
	t.Helper()
	secs := r.churn.Seconds()
	t.Logf("FLEET nodes=%d services=%d rate=%d/s churn=%v writes=%d min-sync=%v started-over=%v", r.nodes, r.services, r.rate, r.churn.Round(time.Millisecond), r.writes, r.minSync, r.stagger)
	t.Logf("FLEET programming latency, all (write, node) pairs: %s; lost=%d; nf_tables generations seen: %d", stats(r.programmed), r.lost, r.gens)
	t.Logf("FLEET programming latency, fastest node per write: %s", stats(r.first))
	t.Logf("FLEET programming latency, slowest node per write: %s", stats(r.last))
	t.Logf("FLEET watch delivery (write sent -> proxier's handler), all pairs: %s", stats(r.delivered))
	t.Logf("FLEET write sent -> end of the proxier's first sync after delivery (the proxier's own view), all pairs: %s", stats(r.synced))
	t.Logf("FLEET proxier syncs during the churn (backend Sync): partial %s; full %s", stats(r.partial), stats(r.full))
	t.Logf("FLEET API write request: %s", stats(r.api))
	t.Logf("FLEET first sync after start, per node: %s", stats(r.firstSync))
	t.Logf("FLEET kube-apiserver CPU over the churn: %.2fs (%.1f%% of one CPU); VmRSS=%.1fMB VmHWM=%.1fMB; etcd CPU %.2fs (%.1f%%)",
		r.apiCPU.Seconds(), 100*r.apiCPU.Seconds()/secs, float64(r.apiRSS)/1024, float64(r.apiHWM)/1024, r.etcdCPU.Seconds(), 100*r.etcdCPU.Seconds()/secs)
	var proxierWatches []string
	for _, res := range []string{"services", "endpointslices", "nodes", "servicecidrs"} {
		proxierWatches = append(proxierWatches, fmt.Sprintf("%s=%g", res, r.during.byResource[res]-r.idle.byResource[res]))
	}
	t.Logf("FLEET watches (apiserver_longrunning_requests{verb=WATCH}) at the end of the churn: %g, of which the proxiers' %g (%s); %g before they started",
		r.during.watches, r.during.watches-r.idle.watches, strings.Join(proxierWatches, " "), r.idle.watches)
	t.Logf("FLEET Service and EndpointSlice watch events sent over the churn: %.0f (%.0f/s), %.1f MB",
		r.during.watchEvents-r.before.watchEvents, (r.during.watchEvents-r.before.watchEvents)/secs, (r.during.watchBytes-r.before.watchBytes)/(1<<20))
	var cpuSum time.Duration
	for _, c := range r.proxierCPU {
		cpuSum += c
	}
	t.Logf("FLEET proxier CPU over the churn, per node: %s; all nodes %.2fs (%.1f%% of one CPU)", stats(r.proxierCPU), cpuSum.Seconds(), 100*cpuSum.Seconds()/secs)
	t.Logf("FLEET test process (writes, probes, monitors) CPU over the churn: %.2fs (%.1f%% of one CPU)", r.selfCPU.Seconds(), 100*r.selfCPU.Seconds()/secs)
	t.Logf("FLEET proxier memory per process: VmRSS (median of its samples every %v) %s; VmHWM %s", sampleEvery, mbStats(r.rss), mbStats(r.hwm))
}
