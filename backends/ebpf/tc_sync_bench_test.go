package ebpf

import "testing"

// BenchmarkTCFullSyncLarge is BenchmarkFullSyncLarge with NorthSouth
// tc: the first sync of 100,000 services of 10 endpoints (every tenth
// with a node port) into the socket maps and the tc plane's (frontends
// for each service address and node port, endpoint slots, local
// endpoints). Run with -benchtime=2x under the heavy-run lock of a
// shared machine.
func BenchmarkTCFullSyncLarge(b *testing.B) { benchFullSyncLarge(b, NorthSouthTC) }
