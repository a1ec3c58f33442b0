//go:build unix

package proxier

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time, user and system, this process has
// used: what a benchmark on a shared machine reports besides wall time,
// which waiting for a CPU inflates.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
