package nftnl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// These tests talk to the kernel in a network namespace they create.
// They need root; PROXYKIT_REQUIRE_PRIVILEGED=1 (or CI=true) turns a
// skip into a failure.

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" || os.Getenv("PROXYKIT_REQUIRE_PRIVILEGED") == "1" {
		t.Fatal("requires root (CI=true or PROXYKIT_REQUIRE_PRIVILEGED=1 forbid skipping)")
	}
	t.Skip("requires root")
}

// testConn returns a connection in a new namespace, removed at cleanup.
func testConn(t *testing.T) *NetlinkConn {
	t.Helper()
	c, err := Dial(testNS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testNS returns a new network namespace, deleted at the end of the
// test.
func testNS(t *testing.T) *netns.NS {
	t.Helper()
	requireRoot(t)
	b := make([]byte, 4)
	rand.Read(b)
	name := "pk-nftnl-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", name).Run() })
	ns, err := netns.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// TestKernelMatchesRecorder commits the sample batch (every message and
// expression kind the backends use) to the kernel and to a recorder: the
// kernel accepts it, and its dump, decoded, is what the recorder's model
// holds.
func TestKernelMatchesRecorder(t *testing.T) {
	c := testConn(t)
	ctx := t.Context()
	for _, f := range []Family{FamilyOf(model.IPv4), FamilyOf(model.IPv6)} {
		rec := NewRecorder()
		if err := rec.Commit(ctx, sampleBatch(t, f, "t")); err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(ctx, sampleBatch(t, f, "t")); err != nil {
			t.Fatalf("%s: %+v", f.Name(), err)
		}
		got, err := c.List(ctx, f.Proto, "t")
		if err != nil {
			t.Fatal(err)
		}
		// The kernel fills in what a NAT range leaves out: the
		// maximum equal to the minimum, and the flags saying so.
		got = natRange.ReplaceAllString(got, "")
		want := natRange.ReplaceAllString(rec.List(f.Proto, "t"), "")
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: kernel dump differs from the recorder's model (-recorder +kernel):\n%s", f.Name(), d)
		}
		sets, err := c.Sets(ctx, f.Proto, "t")
		if err != nil || len(sets) != 4 {
			t.Errorf("%s: sets %v %v", f.Name(), sets, err)
		}
		els, err := c.SetElements(ctx, f.Proto, "t", "svc")
		if err != nil || len(els) != 2 {
			t.Errorf("%s: elements %+v %v", f.Name(), els, err)
		}
		if _, err := c.SetElements(ctx, f.Proto, "t", "nope"); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s: elements of a missing set: %v", f.Name(), err)
		}
	}
}

var natRange = regexp.MustCompile(` (addr_max reg \d+|proto_max reg \d+|flags 0x[0-9a-f]+)`)

// TestKernelFailureNamesOwner: a rejected message is reported with its
// label and owner, and nothing of the batch applies.
func TestKernelFailureNamesOwner(t *testing.T) {
	c := testConn(t)
	ctx := t.Context()
	tx := NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddTable()
	tx.AddChain("a", nil)
	owner := &struct{ name string }{"svc"}
	tx.SetOwner(owner)
	tx.AddRule("missing", nil)
	tx.SetOwner(nil)
	tx.AddChain("b", nil)
	err := c.Commit(ctx, tx)
	var txErr *TxError
	if !errors.As(err, &txErr) || len(txErr.Failures) != 1 {
		t.Fatalf("commit: %+v", err)
	}
	if f := txErr.Failures[0]; f.Owner != owner || f.What != "add rule to chain missing" || !errors.Is(f.Err, unix.ENOENT) {
		t.Errorf("failure %+v", f)
	}
	if ok, err := c.TableExists(ctx, unix.NFPROTO_IPV4, "t"); err != nil || ok {
		t.Errorf("table of a rejected batch exists: %v %v", ok, err)
	}
}

// TestKernelDeleteTableIfEmpty: NLM_F_NONREC refuses a table in use,
// deletes an empty one, and a missing one is ENOENT.
func TestKernelDeleteTableIfEmpty(t *testing.T) {
	c := testConn(t)
	ctx := t.Context()
	tx := NewBatch(unix.NFPROTO_IPV6, "t")
	tx.AddTable()
	tx.AddChain("a", nil)
	if err := c.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	del := func() error {
		tx := NewBatch(unix.NFPROTO_IPV6, "t")
		tx.DelTableIfEmpty()
		return c.Commit(ctx, tx)
	}
	if err := del(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("a table with a chain: %v, want EBUSY", err)
	}
	names, ok, err := c.Chains(ctx, unix.NFPROTO_IPV6, "t")
	if err != nil || !ok || !cmp.Equal(names, []string{"a"}) {
		t.Errorf("chains %v %v %v", names, ok, err)
	}
	tx = NewBatch(unix.NFPROTO_IPV6, "t")
	tx.DelChain("a")
	if err := c.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := del(); err != nil {
		t.Errorf("an empty table: %v", err)
	}
	if err := del(); !errors.Is(err, unix.ENOENT) {
		t.Errorf("a missing table: %v, want ENOENT", err)
	}
	if _, err := c.List(ctx, unix.NFPROTO_IPV6, "t"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("List of a missing table: %v", err)
	}
}

// TestKernelChainExists looks a chain up by name: present, absent, and in
// a table that does not exist; ChainsByTable lists them all.
func TestKernelChainExists(t *testing.T) {
	c := testConn(t)
	tx := NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddTable()
	tx.AddChain("here", nil)
	if err := c.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	tx = NewBatch(unix.NFPROTO_IPV4, "u")
	tx.AddTable()
	tx.AddChain("a", nil)
	tx.AddChain("b", nil)
	if err := c.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	byTable, err := c.ChainsByTable(t.Context(), unix.NFPROTO_IPV4)
	if err != nil || !cmp.Equal(byTable, map[string][]string{"t": {"here"}, "u": {"a", "b"}}) {
		t.Errorf("ChainsByTable: %v, %v", byTable, err)
	}
	for _, tc := range []struct {
		table, chain string
		want         bool
	}{{"t", "here", true}, {"t", "gone", false}, {"none", "here", false}} {
		if got, err := c.ChainExists(t.Context(), unix.NFPROTO_IPV4, tc.table, tc.chain); err != nil || got != tc.want {
			t.Errorf("chain %s of table %s: %v, %v; want %v", tc.chain, tc.table, got, err, tc.want)
		}
	}
}

// TestKernelChainsByTableChecked lists a table of 20,000 chains (dozens
// of datagrams): all of them, uninterrupted when nothing changes; with
// chains committed from another socket during the dump, the kernel
// flags it as interrupted; an ended context stops it.
func TestKernelChainsByTableChecked(t *testing.T) {
	ns := testNS(t)
	c, err := Dial(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 20000
	tx := NewBatch(unix.NFPROTO_IPV4, "t")
	tx.AddTable()
	for i := range n {
		tx.AddChain(fmt.Sprintf("c%05d", i), nil)
	}
	if err := c.Commit(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	byTable, interrupted, err := c.ChainsByTableChecked(t.Context(), unix.NFPROTO_IPV4)
	if err != nil || interrupted || len(byTable["t"]) != n {
		t.Fatalf("quiet table: %d chains, interrupted %v, %v", len(byTable["t"]), interrupted, err)
	}

	other, err := Dial(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	seen := false
	for attempt := 0; attempt < 5 && !seen; attempt++ {
		stop, done := make(chan struct{}), make(chan error, 1)
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				tx := NewBatch(unix.NFPROTO_IPV4, "t")
				tx.AddChain(fmt.Sprintf("new%d-%d", attempt, i), nil)
				if err := other.Commit(context.Background(), tx); err != nil {
					done <- err
					return
				}
			}
		}()
		_, seen, err = c.ChainsByTableChecked(t.Context(), unix.NFPROTO_IPV4)
		close(stop)
		if cerr := <-done; cerr != nil || err != nil {
			t.Fatalf("dump: %v; commits: %v", err, cerr)
		}
	}
	if !seen {
		t.Error("no dump was flagged as interrupted while chains were added")
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := c.ChainsByTableChecked(ctx, unix.NFPROTO_IPV4); !errors.Is(err, context.Canceled) {
		t.Errorf("with an ended context: %v", err)
	}
}
