package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Handler wraps another slog.Handler with per-message rate limiting.
type Handler struct {
	next     slog.Handler
	state    *state
	interval time.Duration
	burst    int
}

type state struct {
	mu     sync.Mutex
	groups map[key]*group
	now    func() time.Time
}

type key struct {
	level slog.Level
	msg   string
}

type group struct {
	start      time.Time
	written    int
	suppressed int
}

// New returns a handler that writes at most burst records with the same
// level and message per interval to next, and counts the rest. Records
// below slog.LevelWarn are not limited.
func New(next slog.Handler, interval time.Duration, burst int) *Handler {
	return &Handler{next: next, interval: interval, burst: burst,
		state: &state{groups: map[key]*group{}, now: time.Now}}
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	s := h.state
	s.mu.Lock()
	now := s.now()
	k := key{r.Level, r.Message}
	g := s.groups[k]
	if g == nil || now.Sub(g.start) >= h.interval {
		var carried int
		if g != nil {
			carried = g.suppressed
		}
		g = &group{start: now, suppressed: carried}
		s.groups[k] = g
		if len(s.groups) > 10000 {
			s.prune(now, h.interval)
		}
	}
	if g.written >= h.burst {
		g.suppressed++
		s.mu.Unlock()
		return nil
	}
	g.written++
	suppressed := g.suppressed
	g.suppressed = 0
	s.mu.Unlock()
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", suppressed))
	}
	return h.next.Handle(ctx, r)
}

func (s *state) prune(now time.Time, interval time.Duration) {
	for k, g := range s.groups {
		if now.Sub(g.start) >= interval && g.suppressed == 0 {
			delete(s.groups, k)
		}
	}
}

// WithAttrs implements slog.Handler; the limit is shared with h.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(attrs)
	return &c
}

// WithGroup implements slog.Handler; the limit is shared with h.
func (h *Handler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	return &c
}
