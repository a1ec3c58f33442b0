package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestHandlerLimitsFloods(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil), time.Minute, 3)
	now := time.Unix(0, 0)
	h.state.now = func() time.Time { return now }
	log := slog.New(h).With("component", "tracker")
	for i := range 100 {
		log.Warn("bad service", "service", i)
		log.Info("fine", "i", i) // not limited
	}
	out := buf.String()
	if n := strings.Count(out, "bad service"); n != 3 {
		t.Fatalf("wrote %d warnings in one interval, want 3", n)
	}
	if n := strings.Count(out, "msg=fine"); n != 100 {
		t.Fatalf("info records limited: %d", n)
	}
	buf.Reset()
	now = now.Add(time.Minute)
	log.Warn("bad service", "service", "x")
	if !strings.Contains(buf.String(), "suppressed=97") {
		t.Fatalf("next interval does not report the suppressed count: %q", buf.String())
	}
	log.Warn("another problem")
	if !strings.Contains(buf.String(), "another problem") {
		t.Fatal("a different message was limited")
	}
}
