package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/proxykit/proxykit/backends"
)

func main() {
	var o options
	flag.StringVar(&o.backend, "backend", "nftables", "dataplane backend: "+strings.Join(backends.Names(), ", "))
	flag.StringVar(&o.services, "services", "", "YAML file of Services and EndpointSlices (default: the bundled services.yaml)")
	flag.BoolVar(&o.watch, "watch", false, "keep running: re-read the file, reprogram and probe again on every change, until Ctrl-C")
	flag.BoolVar(&o.keep, "keep", false, "on exit, leave the sandbox's namespaces and the backend's rules in place for inspection")
	flag.StringVar(&o.remove, "remove", "", "remove the namespaces of a sandbox left by --keep (its ID) and exit")
	flag.IntVar(&o.requests, "requests", defaultRequests, "requests per client and service address")
	flag.BoolVar(&o.raw, "nft", false, "show the backend's rules with its own tool (nft list table) instead of the decoded summary")
	flag.BoolVar(&o.verbose, "v", false, "log the proxier's syncs to standard error")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: sudo go run ./examples/demo [flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
