package sandbox

import (
	"sync"

	"github.com/proxykit/proxykit/internal/cgroup2"
)

// Cgroup is a cgroup v2 that [EnterCgroup] created and moved the whole
// process into: the sockets the process opens from then on, in any
// network namespace (the sandbox's servers and probes among them),
// belong to it. Attach the eBPF backend's socket programs there
// (ebpf.Config.CgroupPath) and no other process of the machine is
// affected.
type Cgroup struct {
	path  string
	leave func() error

	once sync.Once
	err  error
}

// EnterCgroup creates an empty cgroup directly under the cgroup v2 mount,
// named prefix followed by random hex digits (e.g.
// /sys/fs/cgroup/proxykit-demo-1a2b3c4d), and moves this process into it.
// The caller calls [Cgroup.Leave] when done, after closing the proxier
// whose programs are attached to it.
func EnterCgroup(prefix string) (*Cgroup, error) {
	dir, leave, err := cgroup2.Enter(prefix)
	if err != nil {
		return nil, err
	}
	return &Cgroup{path: dir, leave: leave}, nil
}

// Path returns the cgroup's directory, the value ebpf.Config.CgroupPath
// takes.
func (c *Cgroup) Path() string { return c.path }

// Leave moves the process back to the cgroup it came from and removes the
// one [EnterCgroup] made. It is idempotent.
func (c *Cgroup) Leave() error {
	c.once.Do(func() { c.err = c.leave() })
	return c.err
}
