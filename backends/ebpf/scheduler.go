package ebpf

import (
	"sync"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// schedulers lists the Scheduler values of a service port the
// backend knows, as the warning about an unknown one names them.
const schedulers = "mh, maglev, random (or empty for Config.Scheduler)"

// Per-service selection: a service port's Scheduler
// ([model.ServicePort.Scheduler], the proxykit.io/scheduler annotation)
// picks its endpoint selection, as Cilium's per-service
// service.cilium.io/lb-algorithm annotation does. The Maglev maps exist
// whatever Config.Scheduler is, so that any service port can ask for a
// table.

// schedulerSelection returns the scheduler a service port's Scheduler
// asks for: [proxier.SchedulerMaglev] for "mh" and "maglev",
// [proxier.SchedulerRandom] for "random", def when it is empty. Any
// other value gets def, and known is false. The value is expected in
// lower case without surrounding space (as the change tracker makes
// it), but is compared without case and space too.
func schedulerSelection(scheduler string, def proxier.Scheduler) (sel proxier.Scheduler, known bool) {
	if scheduler == "" {
		return def, true
	}
	s, err := proxier.ResolveScheduler("ebpf", proxier.Scheduler(scheduler), Schedulers())
	if err != nil {
		return def, false
	}
	return s, true
}

// schedulerWarnings remembers, per service port, the unknown Scheduler
// value last logged and the families whose backends use it, so that a
// value is logged once per service port (not at every sync, nor once
// per family). Both family backends of a proxier share it.
type schedulerWarnings struct {
	mu sync.Mutex
	m  map[model.ServicePortName]warnedScheduler
}

// warnedScheduler is an unknown Scheduler value that was logged and the
// families (familyBit) whose backends still see it.
type warnedScheduler struct {
	value    string
	families uint8
}

func newSchedulerWarnings() *schedulerWarnings {
	return &schedulerWarnings{m: map[model.ServicePortName]warnedScheduler{}}
}

func familyBit(f model.IPFamily) uint8 {
	if f == model.IPv6 {
		return 2
	}
	return 1
}

// first records that the backend of f sees the unknown value for name,
// and reports whether it is to be logged: when no backend logged that
// value for name since it was last forgotten.
func (w *schedulerWarnings) first(f model.IPFamily, name model.ServicePortName, value string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.m[name]; ok && e.value == value {
		e.families |= familyBit(f)
		w.m[name] = e
		return false
	}
	w.m[name] = warnedScheduler{value: value, families: familyBit(f)}
	return true
}

// forget records that the backend of f no longer sees an unknown value
// for name (the service port is gone, or its Scheduler is known now).
func (w *schedulerWarnings) forget(f model.IPFamily, name model.ServicePortName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forgetLocked(f, name)
}

func (w *schedulerWarnings) forgetLocked(f model.IPFamily, name model.ServicePortName) {
	e, ok := w.m[name]
	if !ok {
		return
	}
	if e.families &^= familyBit(f); e.families == 0 {
		delete(w.m, name)
	} else {
		w.m[name] = e
	}
}

// retain forgets, for the backend of f, every service port for which
// keep is false. A full sync calls it with the service ports whose
// Scheduler is still unknown.
func (w *schedulerWarnings) retain(f model.IPFamily, keep func(model.ServicePortName) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, e := range w.m {
		if e.families&familyBit(f) != 0 && !keep(name) {
			w.forgetLocked(f, name)
		}
	}
}

// selectionFor returns the endpoint selection of sp: the one its
// Scheduler asks for, else Config.Scheduler. An unknown Scheduler is
// logged the first time a backend sees it for the service port.
func (b *backend) selectionFor(sp *model.ServicePort) proxier.Scheduler {
	sel, known := schedulerSelection(sp.Scheduler, b.cfg.Scheduler)
	if !known && b.warned.first(b.family, sp.Name, sp.Scheduler) {
		b.log.Warn("unknown scheduler asked for by the service port; it uses the proxier's endpoint selection",
			"service", sp.Name.String(), "scheduler", sp.Scheduler, "using", string(b.cfg.Scheduler), "accepted", schedulers)
	}
	return sel
}

// unknownScheduler reports whether sp's Scheduler is one the backend
// does not know.
func unknownScheduler(sp *model.ServicePort) bool {
	_, known := schedulerSelection(sp.Scheduler, proxier.SchedulerRandom)
	return !known
}
