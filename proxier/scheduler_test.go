package proxier_test

import (
	"errors"
	"testing"

	"github.com/proxykit/proxykit/proxier"
)

func TestSchedulerCanonical(t *testing.T) {
	for in, want := range map[proxier.Scheduler]proxier.Scheduler{
		"rr": proxier.SchedulerRoundRobin, " SH ": proxier.SchedulerSourceHashing,
		"maglev": proxier.SchedulerMaglev, "Maglev": proxier.SchedulerMaglev, "mh": proxier.SchedulerMaglev,
		"random": proxier.SchedulerRandom,
	} {
		if got, ok := in.Canonical(); !ok || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, ok, want)
		}
	}
	if got, ok := proxier.Scheduler(" FIFO").Canonical(); ok || got != "fifo" {
		t.Errorf("fifo: %q, %v", got, ok)
	}
	// A fresh list: changing it changes nothing.
	l := proxier.Schedulers()
	l[0] = "x"
	if proxier.Schedulers()[0] != proxier.SchedulerRoundRobin {
		t.Error("Schedulers returned shared state")
	}
}

func TestResolveScheduler(t *testing.T) {
	have := []proxier.Scheduler{proxier.SchedulerRandom, proxier.SchedulerMaglev}
	if s, err := proxier.ResolveScheduler("b", "Maglev", have); err != nil || s != proxier.SchedulerMaglev {
		t.Errorf("maglev: %q, %v", s, err)
	}
	for _, in := range []proxier.Scheduler{"rr", "fifo", ""} {
		_, err := proxier.ResolveScheduler("b", in, have)
		var ue *proxier.UnsupportedError
		if !errors.Is(err, proxier.ErrNotSupported) || !errors.As(err, &ue) || ue.Backend != "b" {
			t.Errorf("%q: %v; want an *UnsupportedError of backend b", in, err)
		}
	}
}
