package main

import "testing"

// TestKeepHandWritten checks that a new report keeps the hand-written
// sections of the old one, from the marker on, and only those.
func TestKeepHandWritten(t *testing.T) {
	old := "# old figures\n\n" + handWritten + "\n\n## side by side\nby hand\n"
	if got, want := keepHandWritten("# new figures\n", old), "# new figures\n\n"+handWritten+"\n\n## side by side\nby hand\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := keepHandWritten("# new figures\n", "# old figures\n"); got != "# new figures\n" {
		t.Errorf("without a marker: %q", got)
	}
	if got := keepHandWritten("# new figures\n", ""); got != "# new figures\n" {
		t.Errorf("without an old report: %q", got)
	}
}
