// Package cputime reads the CPU time this process has used. Benchmarks on
// a machine shared with other work report it beside wall time, which
// waiting for a CPU inflates.
package cputime
