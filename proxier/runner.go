package proxier

import (
	"context"
	"time"
)

// runner decides when to sync: at most once per minInterval, at least once
// per period (a full sync), and after a failure again after a backoff that
// doubles up to period. Requests that arrive while a sync runs or within
// minInterval coalesce into one sync.
type runner struct {
	minInterval time.Duration
	period      time.Duration
	retry       time.Duration

	kick chan struct{} // buffered 1: a sync was requested
}

func newRunner(minInterval, period, retry time.Duration) *runner {
	return &runner{minInterval: minInterval, period: period, retry: retry, kick: make(chan struct{}, 1)}
}

// request asks for a sync soon; it never blocks.
func (r *runner) request() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// syncFunc performs one sync; full says the periodic resync is due. It
// returns whether the sync succeeded, and false for "not ready yet" too
// (ready=false), in which case no retry is scheduled.
type syncFunc func(ctx context.Context, full bool) (ok, ready bool)

// loop runs until ctx is done.
func (r *runner) loop(ctx context.Context, sync syncFunc, now func() time.Time) {
	var (
		lastStart   time.Time
		lastFull    = now()
		failures    int
		retryTimer  <-chan time.Time
		periodTimer = time.NewTimer(r.period)
	)
	defer periodTimer.Stop()
	for {
		full := false
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-retryTimer:
		case <-periodTimer.C:
			full = true
		}
		retryTimer = nil
		// Hold back until the minimum interval since the last start has
		// passed; requests arriving meanwhile fold into this sync.
		if wait := r.minInterval - now().Sub(lastStart); !lastStart.IsZero() && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		select {
		case <-r.kick:
		default:
		}
		if now().Sub(lastFull) >= r.period {
			full = true
		}
		lastStart = now()
		ok, ready := sync(ctx, full)
		if ctx.Err() != nil {
			return
		}
		switch {
		case !ready:
		case ok:
			failures = 0
			if full {
				lastFull = lastStart
			}
		default:
			failures++
			backoff := r.retry << min(failures-1, 16)
			if backoff > r.period || backoff <= 0 {
				backoff = r.period
			}
			retryTimer = time.After(backoff)
		}
		if full || !ready {
			if !periodTimer.Stop() {
				select {
				case <-periodTimer.C:
				default:
				}
			}
			periodTimer.Reset(r.period)
		}
	}
}
