package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/sandbox"
)

// Probing parameters.
const (
	defaultRequests = 6
	probeTimeout    = time.Second
)

// labelServiceProxyName marks a Service for another proxy.
const labelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// demo holds the sandbox the demo probes from and the owners of its
// addresses.
type demo struct {
	sb    *sandbox.Sandbox
	names map[netip.Addr]string
}

func newDemo(sb *sandbox.Sandbox) *demo {
	d := &demo{sb: sb, names: map[netip.Addr]string{}}
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		for _, p := range sb.Pods {
			d.names[p.IP(f)] = p.Name
		}
		for _, n := range []*sandbox.Node{sb.Node1, sb.Node2} {
			for _, a := range append(n.Addrs(f), n.Gateway(f)) {
				d.names[a] = n.Name
			}
		}
		d.names[sb.Client.IP(f)] = sb.Client.Name
	}
	return d
}

// name returns the host that owns a, or a itself.
func (d *demo) name(a netip.Addr) string {
	if n, ok := d.names[a.Unmap()]; ok {
		return n
	}
	return a.String()
}

// target is one address of a service probed from one host.
type target struct {
	from  *sandbox.Host
	dst   netip.AddrPort
	proto v1.Protocol
}

// result is what the requests to one target got.
type result struct {
	target
	answers map[string]int          // replies per pod
	sources map[string][]netip.Addr // source addresses the pods saw, per owner
	failure *sandbox.Result         // the first request not answered; probing stopped there
}

// portReport is one service port: what the file says and what the
// requests got.
type portReport struct {
	title     string // "demo/web http 80/TCP"
	traits    []string
	endpoints []string
	skipped   string // why the port is not probed, if it is not
	results   []*result
}

// plan lists the ports of every service with the targets to probe: each
// cluster IP from the node and from a pod, each node port, external IP
// and load-balancer IP from the outside client.
func (d *demo) plan(svcs []*v1.Service, slicesOf map[string][]*discoveryv1.EndpointSlice) []*portReport {
	node, pod, client := &d.sb.Node1.Host, &d.sb.Node1.Pods[0].Host, d.sb.Client
	var out []*portReport
	for _, svc := range svcs {
		if len(svc.Spec.Ports) == 0 {
			out = append(out, &portReport{title: key(svc.Namespace, svc.Name), skipped: "no ports"})
			continue
		}
		for _, sp := range svc.Spec.Ports {
			r := &portReport{title: portTitle(svc, sp), traits: traits(svc)}
			r.endpoints = d.endpoints(svc, sp, slicesOf[key(svc.Namespace, svc.Name)])
			if why := notProxied(svc); why != "" {
				r.skipped = why
				out = append(out, r)
				continue
			}
			add := func(from *sandbox.Host, a netip.Addr, port int32) {
				if a.IsValid() && port > 0 {
					r.results = append(r.results, &result{target: target{from: from, dst: netip.AddrPortFrom(a, uint16(port)), proto: sp.Protocol}})
				}
			}
			var fams []model.IPFamily
			for _, ip := range clusterIPs(svc) {
				add(node, ip, sp.Port)
				add(pod, ip, sp.Port)
				if f := model.FamilyOf(ip); !slices.Contains(fams, f) {
					fams = append(fams, f)
				}
			}
			if sp.NodePort > 0 {
				for _, f := range fams {
					add(client, d.sb.Node1.ExternalIP(f), sp.NodePort)
				}
			}
			for _, ip := range svc.Spec.ExternalIPs {
				a, _ := netip.ParseAddr(ip)
				add(client, a, sp.Port)
			}
			for _, ing := range svc.Status.LoadBalancer.Ingress {
				a, _ := netip.ParseAddr(ing.IP)
				add(client, a, sp.Port)
			}
			out = append(out, r)
		}
	}
	return out
}

// notProxied says why a proxier ignores svc, or returns "".
func notProxied(svc *v1.Service) string {
	switch {
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return "ExternalName: DNS only, nothing to proxy"
	case svc.Spec.ClusterIP == v1.ClusterIPNone:
		return "headless: DNS only, nothing to proxy"
	case svc.Labels[labelServiceProxyName] != "":
		return "labelled for the proxy " + strconv.Quote(svc.Labels[labelServiceProxyName]) + ": not ours"
	}
	return ""
}

func clusterIPs(svc *v1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out
}

func portTitle(svc *v1.Service, sp v1.ServicePort) string {
	proto := sp.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	t := key(svc.Namespace, svc.Name) + "  "
	if sp.Name != "" {
		t += sp.Name + " "
	}
	t += fmt.Sprintf("%d/%s", sp.Port, proto)
	if sp.NodePort > 0 {
		t += fmt.Sprintf(", node port %d", sp.NodePort)
	}
	return t
}

func traits(svc *v1.Service) []string {
	typ := string(svc.Spec.Type)
	if typ == "" {
		typ = string(v1.ServiceTypeClusterIP)
	}
	out := []string{typ}
	if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		out = append(out, "externalTrafficPolicy Local")
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == v1.ServiceInternalTrafficPolicyLocal {
		out = append(out, "internalTrafficPolicy Local")
	}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		a := "sessionAffinity ClientIP"
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			a += fmt.Sprintf(" %ds", *c.ClientIP.TimeoutSeconds)
		}
		out = append(out, a)
	}
	return out
}

// endpoints lists the endpoints of one service port by host name.
func (d *demo) endpoints(svc *v1.Service, sp v1.ServicePort, sls []*discoveryv1.EndpointSlice) []string {
	proto := cmp.Or(sp.Protocol, v1.ProtocolTCP)
	var out []string
	for _, sl := range sls {
		var port int32
		found := false
		for _, p := range sl.Ports {
			if ptr(p.Name) == sp.Name && cmp.Or(ptr(p.Protocol), v1.ProtocolTCP) == proto && p.Port != nil {
				port, found = *p.Port, true
			}
		}
		if !found {
			continue
		}
		for _, ep := range sl.Endpoints {
			for _, addr := range ep.Addresses {
				a, err := netip.ParseAddr(addr)
				if err != nil {
					continue
				}
				e := d.name(a) + ":" + strconv.Itoa(int(port))
				if c := ep.Conditions; c.Ready != nil && !*c.Ready {
					e += " (not ready)"
				}
				out = append(out, e)
			}
		}
	}
	return out
}

func ptr[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// probe sends n requests to every target of reports.
func (d *demo) probe(ctx context.Context, reports []*portReport, n int) {
	for _, r := range reports {
		for _, res := range r.results {
			if ctx.Err() != nil {
				return
			}
			d.probeOne(ctx, res, n)
		}
	}
}

func (d *demo) probeOne(ctx context.Context, res *result, n int) {
	res.answers = map[string]int{}
	res.sources = map[string][]netip.Addr{}
	for range n {
		if ctx.Err() != nil {
			return
		}
		var r sandbox.Result
		switch res.proto {
		case v1.ProtocolUDP:
			r = res.from.UDP(res.dst, probeTimeout)
		case v1.ProtocolSCTP:
			r = res.from.SCTPInit(res.dst, probeTimeout)
		default:
			r = res.from.TCP(res.dst, probeTimeout)
		}
		if r.Outcome != sandbox.Answered {
			res.failure = &r
			return
		}
		res.answers[r.Server]++
		src := r.Source.Addr()
		owner := d.name(src)
		if !slices.Contains(res.sources[owner], src) {
			res.sources[owner] = append(res.sources[owner], src)
		}
	}
}

// print writes the reports.
func (d *demo) print(w io.Writer, reports []*portReport) {
	for _, r := range reports {
		fmt.Fprintf(w, "\n%s", r.title)
		if len(r.traits) > 0 {
			fmt.Fprintf(w, "  (%s)", strings.Join(r.traits, ", "))
		}
		fmt.Fprintln(w)
		if len(r.endpoints) == 0 {
			fmt.Fprintln(w, "  endpoints: none")
		} else {
			fmt.Fprintf(w, "  endpoints: %s\n", strings.Join(r.endpoints, ", "))
		}
		if r.skipped != "" {
			fmt.Fprintf(w, "  not probed: %s\n", r.skipped)
			continue
		}
		for _, res := range r.results {
			fmt.Fprintf(w, "  %-10s → %-22s %s\n", res.from.Name, res.dst, res.summary())
		}
	}
}

// summary says who answered and what source they saw, or how the
// requests failed.
func (r *result) summary() string {
	var b strings.Builder
	pods := make([]string, 0, len(r.answers))
	for p := range r.answers {
		pods = append(pods, p)
	}
	slices.Sort(pods)
	for i, p := range pods {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s ×%d", p, r.answers[p])
	}
	if len(pods) > 0 {
		owners := make([]string, 0, len(r.sources))
		for o := range r.sources {
			owners = append(owners, o)
		}
		slices.Sort(owners)
		var srcs []string
		for _, o := range owners {
			addrs := make([]string, len(r.sources[o]))
			for i, a := range r.sources[o] {
				addrs[i] = a.String()
			}
			if len(addrs) == 1 && addrs[0] == o {
				srcs = append(srcs, o)
				continue
			}
			srcs = append(srcs, fmt.Sprintf("%s (%s)", o, strings.Join(addrs, ", ")))
		}
		fmt.Fprintf(&b, "; source seen: %s", strings.Join(srcs, ", "))
	}
	if r.failure != nil {
		if len(pods) > 0 {
			b.WriteString("; then ")
		}
		b.WriteString(r.failure.Outcome.String())
		switch {
		case r.failure.Outcome.Rejected():
			b.WriteString(" (rejected by the proxier)")
		case r.failure.Outcome.Silent():
			b.WriteString(" (dropped)")
		default:
			fmt.Fprintf(&b, ": %v", r.failure.Err)
		}
	}
	if len(pods) == 0 && r.failure == nil {
		b.WriteString("not probed (interrupted)")
	}
	return b.String()
}
