package ebpf

import (
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// TestCgroupProgramsWhileAttaching reads a cgroup's programs while
// another agent attaches and detaches one there: the kernel answers a
// query in two calls, and a program attached between them must not make
// the read fail (it did, with ENOSPC, in a parallel conformance run).
func TestCgroupProgramsWhileAttaching(t *testing.T) {
	dir := emptyCgroup(t)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	// One program stays, so that no read finds the cgroup empty (the
	// library answers that after the first call).
	keep, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: ebpf.AttachCGroupInet4Connect, Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attachErr error
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: ebpf.AttachCGroupInet4Connect, Program: prog})
			if err != nil {
				attachErr = err
				return
			}
			l.Close()
		}
	})
	const reads = 20000
	for i := range reads {
		if _, err := cgroupPrograms(dir, ebpf.AttachCGroupInet4Connect); err != nil {
			t.Errorf("read %d of %d: %v", i+1, reads, err)
			break
		}
	}
	close(stop)
	wg.Wait()
	if attachErr != nil {
		t.Fatal(attachErr)
	}
}
