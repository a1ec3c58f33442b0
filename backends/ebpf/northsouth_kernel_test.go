package ebpf

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// fakeNorthSouth stands for the composed nftables table: its Sync
// returns err and counts the calls.
type fakeNorthSouth struct {
	family model.IPFamily
	err    error
	calls  atomic.Int32
}

func (f *fakeNorthSouth) Name() string                  { return "fake" }
func (f *fakeNorthSouth) Family() model.IPFamily        { return f.family }
func (f *fakeNorthSouth) Cleanup(context.Context) error { return nil }
func (f *fakeNorthSouth) Close() error                  { return nil }
func (f *fakeNorthSouth) Sync(context.Context, *proxier.SyncRequest) error {
	f.calls.Add(1)
	return f.err
}

// TestFullSyncNorthSouthFails: a full sync syncs the north-south table
// while it reads the maps; a table that fails (not with object errors
// alone) leaves the maps and the state in memory as they were, and one
// that fails with object errors alone lets the maps be written and its
// errors returned.
func TestFullSyncNorthSouthFails(t *testing.T) {
	x := newFixture(t, model.IPv4, nil)
	v := vip(model.IPv4, 71)
	a := svc("a", model.TCP, v, 80, x.ep(x.p11, 8080))
	b := svc("b", model.TCP, v, 81, x.ep(x.p12, 8080), x.ep(x.p21, 8080))
	x.sync([]testSvc{a})
	st := x.b.st
	keys := func() map[feKey]svcVal {
		t.Helper()
		m, err := x.b.codec.readSvc(x.b.svcMap)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := keys()

	failing := &fakeNorthSouth{family: model.IPv4, err: errors.New("netlink: no buffer space")}
	x.b.nft = failing
	err := x.b.Sync(t.Context(), request(x.f, []testSvc{a, b}, nil))
	if err == nil || proxier.OnlyObjectErrors(err) {
		t.Fatalf("full sync with a failing north-south table: %v, want its error", err)
	}
	if failing.calls.Load() != 1 {
		t.Errorf("north-south table synced %d times, want 1", failing.calls.Load())
	}
	if got := keys(); len(got) != len(before) {
		t.Errorf("maps after the failed sync: %d frontends, want the %d before", len(got), len(before))
	}
	if x.b.st != st {
		t.Error("the failed sync replaced the state in memory")
	}
	x.answers(x.pod3, "tcp", ap(v, 80), 8080, 2, x.p11)

	objErr := &fakeNorthSouth{family: model.IPv4, err: &proxier.ObjectError{Service: b.Port.Name, Err: errors.New("not in the table")}}
	x.b.nft = objErr
	err = x.b.Sync(t.Context(), request(x.f, []testSvc{a, b}, nil))
	if err == nil || !proxier.OnlyObjectErrors(err) {
		t.Fatalf("full sync with a table's object error: %v, want that object error alone", err)
	}
	if got := keys(); len(got) != len(before)+1 {
		t.Errorf("maps after the sync: %d frontends, want %d", len(got), len(before)+1)
	}
	x.answers(x.pod3, "tcp", ap(v, 81), 8080, 4, x.p12, x.p21)
}
