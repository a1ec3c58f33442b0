package sandbox_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/proxykit/proxykit/sandbox"
)

// A sandbox and one probe: node1 reaches its first pod's server directly.
// A proxier would run in sb.Node1.NetNSPath() and be probed the same way,
// at a service address. (It needs root, so it is not run as a test.)
func Example() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	pod := sb.Node1.Pods[0]
	r := sb.Node1.TCP(netip.AddrPortFrom(pod.IPv4, sandbox.ServerPorts()[0]), time.Second)
	if r.Outcome != sandbox.Answered {
		log.Fatal(r)
	}
	fmt.Printf("%s answered, seeing %s\n", r.Server, r.Source.Addr())
}
