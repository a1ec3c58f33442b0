package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/static"
	"github.com/proxykit/proxykit/sandbox"
)

// defaultSelector selects the Services the controller proxies.
const defaultSelector = "proxykit.example/expose=true"

//go:embed services.yaml
var bundledServices []byte

// options are the command line.
type options struct {
	services string // empty: the bundled file
	selector string
}

// Timeouts. A Service that is not proxied has no rule, so requests to it
// follow node1's default route, where nothing answers: they time out.
const (
	flushTimeout = 15 * time.Second
	probeTimeout = 500 * time.Millisecond
	requests     = 6
)

// run is the controller: it proxies the selected Services of the file
// into its own namespace, then checks with traffic that exactly those
// answer.
func run(ctx context.Context, o options, out io.Writer) (err error) {
	if o.selector == "" {
		o.selector = defaultSelector
	}
	sel, err := labels.Parse(o.selector)
	if err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	path := o.services
	if path == "" {
		dir, err := os.MkdirTemp("", "proxykit-controller-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "services.yaml")
		if err := os.WriteFile(path, bundledServices, 0o644); err != nil {
			return err
		}
	}
	objs, err := static.Load(path)
	if de := (*static.DocumentError)(nil); err != nil && !errors.As(err, &de) {
		return err
	}

	sb, err := sandbox.New(ctx, sandbox.Options{Node1Pods: 2, Node2Pods: 1})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sb.Close()) }()
	p, err := nftables.New(nftables.Config{Config: proxier.Config{
		NetNS:           sb.Node1.NetNSPath(),
		NodeName:        sb.Node1.Name,
		Families:        []model.IPFamily{model.IPv4, model.IPv6},
		MinSyncInterval: 50 * time.Millisecond,
	}})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		cancel()
		err = errors.Join(err, <-done)
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = errors.Join(err, p.Cleanup(cctx))
		ccancel()
		err = errors.Join(err, p.Close())
	}()

	// The static source delivers the file once (no Watch) to the filter,
	// which passes the selected Services on to the proxier.
	src := &static.Source{Path: path}
	if err := src.Run(runCtx, &selecting{Proxier: p, selector: sel}); err != nil {
		return err
	}
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	err = p.Flush(fctx)
	fcancel()
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "controller: proxying Services matching %q into its namespace %s\n", sel.String(), sb.Node1.NetNSName())
	podOf := map[netip.Addr]string{}
	for _, pod := range sb.Pods {
		podOf[pod.IPv4], podOf[pod.IPv6] = pod.Name, pod.Name
	}
	var failed []string
	for _, svc := range objs.Services {
		selected := sel.Matches(labels.Set(svc.Labels))
		var want []string // the pods behind the service
		for _, sl := range objs.EndpointSlices {
			if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name {
				continue
			}
			for _, ep := range sl.Endpoints {
				for _, a := range ep.Addresses {
					if addr, err := netip.ParseAddr(a); err == nil && podOf[addr] != "" {
						want = append(want, podOf[addr])
					}
				}
			}
		}
		vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil {
			fmt.Fprintf(out, "  %-16s no cluster IP, skipped\n", svc.Namespace+"/"+svc.Name)
			continue
		}
		for _, sp := range svc.Spec.Ports {
			dst := netip.AddrPortFrom(vip, uint16(sp.Port))
			got, result := probe(&sb.Node1.Host, dst)
			status := "not selected"
			if selected {
				status = "selected"
			}
			ok := selected && len(got) > 0 && !slices.ContainsFunc(got, func(p string) bool { return !slices.Contains(want, p) }) ||
				!selected && len(got) == 0
			verdict := "ok"
			if !ok {
				verdict = "UNEXPECTED"
				failed = append(failed, svc.Name)
			}
			fmt.Fprintf(out, "  %-16s %-20s %-13s %-40s %s\n", svc.Namespace+"/"+svc.Name, dst, status, result, verdict)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("not proxied as selected: %s", strings.Join(failed, ", "))
	}
	return nil
}

// probe sends requests from h to dst and returns the pods that answered
// and a summary.
func probe(h *sandbox.Host, dst netip.AddrPort) ([]string, string) {
	var got []string
	for range requests {
		r := h.TCP(dst, probeTimeout)
		if r.Outcome != sandbox.Answered {
			if len(got) == 0 {
				return nil, "→ " + r.Outcome.String()
			}
			break
		}
		if !slices.Contains(got, r.Server) {
			got = append(got, r.Server)
		}
	}
	slices.Sort(got)
	return got, "→ " + strings.Join(got, ", ")
}
