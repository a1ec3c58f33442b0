package cputime

import "testing"

// TestProcessGrows: work on the CPU shows in the process's CPU time.
func TestProcessGrows(t *testing.T) {
	before := Process()
	if before <= 0 {
		t.Fatalf("Process() = %v before any work, want > 0", before)
	}
	x := uint64(1)
	for i := range 50_000_000 {
		x = x*6364136223846793005 + uint64(i)
	}
	if after := Process(); after <= before {
		t.Errorf("Process() did not grow over a busy loop: %v then %v (%d)", before, after, x)
	}
}
