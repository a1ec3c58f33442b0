package nodesetup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/proxykit/proxykit/internal/nodesetup"
)

// A daemon's start-up: kube-proxy's defaults for the conntrack section,
// nftables mode, in the proxier's namespace. --dry-run would call Plan.
func ExampleApply() {
	cfg := nodesetup.Config{
		NetNS: "/var/run/netns/node1",
		Conntrack: nodesetup.Conntrack{
			MaxPerCore:            32768,
			Min:                   131072,
			TCPEstablishedTimeout: 24 * time.Hour,
			TCPCloseWaitTimeout:   time.Hour,
		},
		Mode:   "nftables",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	changes, err := nodesetup.Apply(context.Background(), cfg)
	if errors.Is(err, nodesetup.ErrHostGlobal) {
		// Not the host's namespace: nf_conntrack_max is the host's.
		// kube-proxy's answer is conntrack.maxPerCore: 0.
		cfg.Conntrack.MaxPerCore = 0
		changes, err = nodesetup.Apply(context.Background(), cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "could not set conntrack parameters:", err)
		return
	}
	for _, c := range changes {
		fmt.Println(c)
	}
}
