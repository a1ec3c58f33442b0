//go:build unix

package cputime

import (
	"time"

	"golang.org/x/sys/unix"
)

// Process returns the CPU time, user and system, this process has used
// so far, or 0 when the kernel does not say.
func Process() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
