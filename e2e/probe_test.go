package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
)

// probeTimeout bounds one probe. A destination nothing is programmed for
// is routed to node1's uplink, which drops it: the probe times out.
const probeTimeout = 300 * time.Millisecond

// answeredWithin probes dst from h until a probe is answered by one of
// want (any pod when want is empty), and fails the test unless that
// happens within limit of since. It returns the time from since to the
// answer.
func answeredWithin(t *testing.T, h *testnet.Host, dst netip.AddrPort, since time.Time, limit time.Duration, want ...string) time.Duration {
	t.Helper()
	var last testnet.Result
	for time.Since(since) < limit {
		last = h.TCP(dst, probeTimeout)
		if last.Outcome == testnet.Answered && (len(want) == 0 || slices.Contains(want, last.Server)) {
			return time.Since(since)
		}
		if last.Elapsed < 20*time.Millisecond {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Fatalf("%s → %s: no answer from %v within %v of the API write; last probe %v", h.Name, dst, want, limit, last)
	return 0
}

// answer probes dst from h and returns the answer; it fails the test
// unless one of two probes in a row is answered. A probe answered only on
// its second try, 20 ms later, is logged as a glitch, on a line starting
// with E2E-GLITCH, and tolerated up to maxGlitches per spread. (Before
// the proxy deleted untranslated SYNs to new service addresses, such
// failures came from the tests' own earlier probes; none are expected
// now.)
func answer(t *testing.T, h *testnet.Host, dst netip.AddrPort) (r testnet.Result, glitch bool) {
	t.Helper()
	if r = h.TCP(dst, time.Second); r.Outcome == testnet.Answered {
		return r, false
	}
	t.Logf("E2E-GLITCH %s → %s: %v; retrying", h.Name, dst, r)
	time.Sleep(20 * time.Millisecond) // the failures seen came in bursts of about 1 ms
	if r2 := h.TCP(dst, time.Second); r2.Outcome == testnet.Answered {
		return r2, true
	}
	t.Fatalf("%s → %s: %v, twice in a row", h.Name, dst, r)
	return r, true
}

// maxGlitches is how many probes of one spread may need a second try.
const maxGlitches = 2

// reachable is answeredWithin followed by a check that the proxy deleted
// the untranslated SYNs the waiting probes left to dst's address (see
// untranslatedLeft): they must not become traps for later probes.
func (e *env) reachable(t *testing.T, h *testnet.Host, dst netip.AddrPort, since time.Time, limit time.Duration, want ...string) time.Duration {
	t.Helper()
	took := answeredWithin(t, h, dst, since, limit, want...)
	if n := e.untranslatedLeft(dst.Addr(), 2*time.Second); n > 0 {
		t.Fatalf("%d untranslated SYNs to %s are still in node1's conntrack table 2 s after it answered: the proxy must delete them when it programs the address", n, dst.Addr())
	}
	return took
}

// spread sends n probes from h to dst and counts the answers per pod (see
// answer for failures).
func spread(t *testing.T, h *testnet.Host, dst netip.AddrPort, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	glitches := 0
	for range n {
		r, glitch := answer(t, h, dst)
		if glitch {
			if glitches++; glitches > maxGlitches {
				t.Fatalf("%s → %s: %d of %d probes needed a second try", h.Name, dst, glitches, n)
			}
		}
		got[r.Server]++
	}
	return got
}

// answeredOnlyBy checks that n probes from h to dst are all answered by
// pods of want, each of them at least once.
func answeredOnlyBy(t *testing.T, h *testnet.Host, dst netip.AddrPort, n int, want ...string) map[string]int {
	t.Helper()
	got := spread(t, h, dst, n)
	for s := range got {
		if !slices.Contains(want, s) {
			t.Fatalf("%s → %s: answered by %s, want only %v (all: %v)", h.Name, dst, s, want, got)
		}
	}
	for _, w := range want {
		if got[w] == 0 {
			t.Fatalf("%s → %s: %d probes never reached %s (got %v)", h.Name, dst, n, w, got)
		}
	}
	return got
}

// silentWithin probes dst from h until three probes in a row are not
// answered, and fails the test unless that happens within limit of since;
// then it checks that three more probes are not answered either. It
// returns the time from since to the first of the three.
func silentWithin(t *testing.T, h *testnet.Host, dst netip.AddrPort, since time.Time, limit time.Duration) time.Duration {
	t.Helper()
	var first time.Time
	for silent := 0; silent < 3; {
		at := time.Now()
		r := h.TCP(dst, probeTimeout)
		if r.Outcome != testnet.Answered {
			if silent == 0 {
				first = at
			}
			silent++
			continue
		}
		silent = 0
		if time.Since(since) > limit {
			t.Fatalf("%s → %s: still answered %v after the API write: %v", h.Name, dst, limit, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 3 {
		if r := h.TCP(dst, probeTimeout); r.Outcome == testnet.Answered {
			t.Fatalf("%s → %s: answered again after it stopped: %v", h.Name, dst, r)
		}
	}
	return first.Sub(since)
}

// neverAnswered probes dst from h for d and fails the test on any answer.
func neverAnswered(t *testing.T, h *testnet.Host, dst netip.AddrPort, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if r := h.TCP(dst, probeTimeout); r.Outcome == testnet.Answered {
			t.Fatalf("%s → %s: answered, want no answer: %v", h.Name, dst, r)
		}
	}
}

// firstAnswer measures the time from since to the first connection from h
// to dst answered by one of want (any pod when want is empty): it starts
// a new probe every step, so a probe whose SYN went out before the rules
// were in place (and is lost) does not delay the measurement by its
// timeout. It gives up after limit.
func firstAnswer(h *testnet.Host, dst netip.AddrPort, since time.Time, limit, step time.Duration, want ...string) (time.Duration, error) {
	type answer struct {
		at time.Time
		r  testnet.Result
	}
	answers := make(chan answer, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	tick := time.NewTicker(step)
	defer tick.Stop()
	deadline := time.NewTimer(limit - time.Since(since))
	defer deadline.Stop()
	var last testnet.Result
	var lastMu sync.Mutex
	for {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.TCP(dst, probeTimeout)
			if r.Outcome == testnet.Answered && (len(want) == 0 || slices.Contains(want, r.Server)) {
				select {
				case answers <- answer{time.Now(), r}:
				default:
				}
				return
			}
			lastMu.Lock()
			last = r
			lastMu.Unlock()
		}()
		select {
		case a := <-answers:
			return a.at.Sub(since), nil
		case <-deadline.C:
			lastMu.Lock()
			defer lastMu.Unlock()
			return 0, fmt.Errorf("%s → %s: no answer from %v within %v; last probe %v", h.Name, dst, want, limit, last)
		case <-tick.C:
		}
	}
}

// httpGet sends GET path to dst from the namespace of h and returns the
// status code and body (health check node ports serve HTTP).
func httpGet(h *testnet.Host, dst netip.AddrPort, path string, timeout time.Duration) (int, string, error) {
	var code int
	var body string
	err := h.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		req, err := http.NewRequest(http.MethodGet, "http://"+dst.String()+path, nil)
		if err != nil {
			return err
		}
		req.Close = true
		if err := req.Write(c); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		code, body = resp.StatusCode, string(b[:n])
		return nil
	})
	return code, body, err
}
