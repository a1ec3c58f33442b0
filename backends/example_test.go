package backends_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/proxykit/proxykit/backends"
	"github.com/proxykit/proxykit/proxier"
)

// Names lists every backend the registry builds.
func ExampleNames() {
	for _, n := range backends.Names() {
		fmt.Println(n)
	}
	// Output:
	// ebpf
	// iptables
	// ipvs
	// nftables
}

// New builds a backend chosen by name, as a daemon's --proxy-mode does,
// with the shared options in the embedded proxier.Config and each
// backend's own in its section. It programs the kernel, so it has no
// checked output: see ExampleNames, and the conformance suite for the
// same with traffic.
func ExampleNew() {
	cfg := backends.Config{Config: proxier.Config{NetNS: "/var/run/netns/node1", NodeName: "node1"}}
	cfg.IPVS.Scheduler = proxier.SchedulerMaglev // used by ipvs only
	cfg.EBPF.CgroupPath = "/sys/fs/cgroup"       // required by ebpf only

	p, err := backends.New("ipvs", cfg)
	if errors.Is(err, proxier.ErrNotSupported) {
		// A kernel without IPVS: fall back, as kube-proxy users would.
		p, err = backends.New("nftables", cfg)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	// Feed p from an informer (proxier/informer) or any other source.
}
