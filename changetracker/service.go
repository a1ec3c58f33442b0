package changetracker

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
)

// LabelServiceProxyName is the label that hands a Service to a particular
// proxy implementation; see [Config.ServiceProxyName].
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// AnnotationScheduler is the Service annotation that asks for a
// load-balancing algorithm other than the proxier's, e.g. an IPVS
// scheduler ("sh" for source hashing); it becomes
// [model.ServicePort.Scheduler], trimmed and lower-cased.
const AnnotationScheduler = "proxykit.io/scheduler"

// AnnotationForwardingMode is the Service annotation that asks for how
// traffic from outside the node reaches a remote endpoint: "snat" or
// "dsr" (direct server return); it becomes
// [model.ServicePort.ForwardingMode], trimmed and lower-cased.
const AnnotationForwardingMode = "proxykit.io/forwarding-mode"

// defaultAffinityTimeout is the session affinity timeout of a ClientIP
// Service that does not set one.
const defaultAffinityTimeout = time.Duration(v1.DefaultClientIPServiceAffinitySeconds) * time.Second

// OnService records a Service event: an add when old is nil, a delete when
// cur is nil, an update otherwise. Neither object is kept or modified.
func (t *Tracker) OnService(old, cur *v1.Service) {
	switch {
	case cur == nil && old == nil:
		t.log.Warn("service event without a service")
		return
	case cur == nil:
		t.setServicePending(serviceName(old), nil)
		return
	case old != nil && serviceName(old) != serviceName(cur):
		// Informers never rename; treat it as a delete and an add.
		t.setServicePending(serviceName(old), nil)
	}
	t.setServicePending(serviceName(cur), t.servicePorts(cur))
}

func serviceName(svc *v1.Service) model.ServiceName {
	return model.ServiceName{Namespace: svc.Namespace, Name: svc.Name}
}

// setServicePending makes ports the pending state of the Service, or drops
// the pending change when ports equals what is applied.
func (t *Tracker) setServicePending(name model.ServiceName, ports []*model.ServicePort) {
	var applied []*model.ServicePort
	if e := t.svcs[name]; e != nil {
		applied = e.ports
	}
	if servicePortsEqual(applied, ports) {
		delete(t.svcPending, name)
		return
	}
	t.svcPending[name] = ports
	t.svcPeak = max(t.svcPeak, len(t.svcPending))
}

// applyService folds the pending ports of one Service into the state.
func (t *Tracker) applyService(name model.ServiceName, ports []*model.ServicePort, res *Result) {
	e := t.entry(name)
	old := e.ports
	if len(e.slices) > 0 && clusterIPOf(old) != clusterIPOf(ports) {
		// Endpoints at the Service's own cluster IP are left out:
		// fold its endpoints again.
		t.affected = append(t.affected, name)
	}
	inNew, inOld := portLookup(ports), portLookup(old)
	for _, op := range old {
		if inNew.find(op.Name) != nil {
			continue
		}
		delete(t.state.Services, op.Name)
		res.Changed[op.Name] = struct{}{}
		res.setOld(op)
		if op.Protocol.Connectionless() {
			res.StaleServices = append(res.StaleServices, op.Name)
		}
	}
	for i, np := range ports {
		op := inOld.find(np.Name)
		if op != nil && servicePortEqual(op, np) {
			// Keep the published pointer of an unchanged port.
			ports[i] = op
			continue
		}
		t.state.Services[np.Name] = np
		res.Changed[np.Name] = struct{}{}
		if op != nil {
			res.setOld(op)
		}
	}
	e.ports = ports
	t.gc(name, e)
}

// clusterIPOf returns the cluster IP of a Service's ports (all have the
// same), or the zero Addr.
func clusterIPOf(ports []*model.ServicePort) netip.Addr {
	if len(ports) == 0 {
		return netip.Addr{}
	}
	return ports[0].ClusterIP
}

func (r *Result) setOld(p *model.ServicePort) {
	if r.OldServices == nil {
		r.OldServices = make(map[model.ServicePortName]*model.ServicePort)
	}
	r.OldServices[p.Name] = p
}

// portSet finds the ports of a list by name. It searches a few ports
// linearly and indexes many, so that a Service with thousands of ports
// costs no quadratic time; a small set allocates nothing.
type portSet struct {
	ports []*model.ServicePort
	index map[model.ServicePortName]*model.ServicePort
}

func portLookup(ports []*model.ServicePort) portSet {
	if len(ports) <= 16 {
		return portSet{ports: ports}
	}
	m := make(map[model.ServicePortName]*model.ServicePort, len(ports))
	for _, p := range ports {
		m[p.Name] = p
	}
	return portSet{index: m}
}

// find returns the port named n, or nil.
func (s portSet) find(n model.ServicePortName) *model.ServicePort {
	if s.index != nil {
		return s.index[n]
	}
	for _, p := range s.ports {
		if p.Name == n {
			return p
		}
	}
	return nil
}

// selected reports whether the tracker handles svc, according to its
// labels.
func (t *Tracker) selected(svc *v1.Service) bool {
	if _, ok := svc.Labels[v1.IsHeadlessService]; ok {
		return false
	}
	v, ok := svc.Labels[LabelServiceProxyName]
	if t.proxyName == "" {
		return !ok
	}
	return ok && v == t.proxyName
}

// servicePorts converts svc into its service ports of the tracker's family.
// It returns nil when the Service is skipped in this family.
func (t *Tracker) servicePorts(svc *v1.Service) []*model.ServicePort {
	name := serviceName(svc)
	spec := &svc.Spec
	if !t.selected(svc) {
		t.log.Debug("service not selected by its labels", "service", name.String())
		return nil
	}
	if spec.Type == v1.ServiceTypeExternalName {
		return nil
	}
	clusterIP, ok := t.clusterIP(name, spec)
	if !ok {
		return nil
	}

	isLB := spec.Type == v1.ServiceTypeLoadBalancer
	hasNodePorts := isLB || spec.Type == v1.ServiceTypeNodePort
	base := model.ServicePort{
		ClusterIP:      clusterIP,
		ExternalIPs:    t.addrs(name, "externalIP", spec.ExternalIPs),
		ExternalPolicy: model.PolicyCluster,
		InternalPolicy: model.PolicyCluster,
	}
	if isLB {
		base.LoadBalancerIPs = t.lbIPs(name, svc.Status.LoadBalancer.Ingress)
		base.LoadBalancerSourceRanges = t.sourceRanges(name, svc)
	}
	if spec.SessionAffinity == v1.ServiceAffinityClientIP {
		base.SessionAffinity = true
		base.AffinityTimeout = t.affinityTimeout(name, spec.SessionAffinityConfig)
	}
	if hasNodePorts && spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		base.ExternalPolicy = model.PolicyLocal
		if isLB {
			if p, ok := validPort(spec.HealthCheckNodePort); ok {
				base.HealthCheckNodePort = p
			} else {
				t.log.Warn("healthCheckNodePort missing or out of range, ignored", "service", name.String(), "port", spec.HealthCheckNodePort)
			}
		}
	}
	if p := spec.InternalTrafficPolicy; p != nil && *p == v1.ServiceInternalTrafficPolicyLocal {
		base.InternalPolicy = model.PolicyLocal
	}
	if v, ok := svc.Annotations[AnnotationScheduler]; ok {
		base.Scheduler = strings.ToLower(strings.TrimSpace(v))
	}
	if v, ok := svc.Annotations[AnnotationForwardingMode]; ok {
		base.ForwardingMode = strings.ToLower(strings.TrimSpace(v))
	}
	if d := spec.TrafficDistribution; d != nil {
		switch *d {
		case v1.ServiceTrafficDistributionPreferClose, v1.ServiceTrafficDistributionPreferSameZone:
			base.TrafficDistribution = model.PreferSameZone
		case v1.ServiceTrafficDistributionPreferSameNode:
			base.TrafficDistribution = model.PreferSameNode
		}
	}

	ports := make([]*model.ServicePort, 0, len(spec.Ports))
	var seen map[model.ServicePortName]struct{} // for Services with many ports
	if len(spec.Ports) > 16 {
		seen = make(map[model.ServicePortName]struct{}, len(spec.Ports))
	}
	for i := range spec.Ports {
		sp := &spec.Ports[i]
		proto, ok := protocol(sp.Protocol)
		if !ok {
			t.log.Warn("unsupported protocol, port ignored", "service", name.String(), "port", sp.Name, "protocol", sp.Protocol)
			continue
		}
		num, ok := validPort(sp.Port)
		if !ok {
			t.log.Warn("port number out of range, port ignored", "service", name.String(), "port", sp.Name, "number", sp.Port)
			continue
		}
		spn := model.ServicePortName{ServiceName: name, Port: sp.Name, Protocol: proto}
		if isDuplicate(ports, seen, spn) {
			t.log.Warn("duplicate port, keeping the first", "service", name.String(), "port", spn.String())
			continue
		}
		p := base
		p.Name = spn
		p.Port = num
		p.Protocol = proto
		if hasNodePorts && sp.NodePort != 0 {
			if np, ok := validPort(sp.NodePort); ok {
				p.NodePort = np
			} else {
				t.log.Warn("nodePort out of range, ignored", "service", name.String(), "port", spn.String(), "nodePort", sp.NodePort)
			}
		}
		ports = append(ports, &p)
	}
	if len(ports) == 0 {
		return nil
	}
	return ports
}

// isDuplicate reports whether ports already has a port named n, and records
// n in seen when seen is not nil.
func isDuplicate(ports []*model.ServicePort, seen map[model.ServicePortName]struct{}, n model.ServicePortName) bool {
	if seen != nil {
		if _, ok := seen[n]; ok {
			return true
		}
		seen[n] = struct{}{}
		return false
	}
	for _, p := range ports {
		if p.Name == n {
			return true
		}
	}
	return false
}

// clusterIP returns the cluster IP of svc in the tracker's family. ok is
// false when the Service has none in this family (single-stack of the other
// family, headless, not allocated) or when the one it has is invalid.
func (t *Tracker) clusterIP(name model.ServiceName, spec *v1.ServiceSpec) (netip.Addr, bool) {
	ips := spec.ClusterIPs
	if len(ips) == 0 && spec.ClusterIP != "" {
		ips = []string{spec.ClusterIP}
	}
	if len(ips) == 0 {
		t.log.Debug("service has no cluster IP", "service", name.String())
		return netip.Addr{}, false
	}
	if spec.ClusterIP == v1.ClusterIPNone || ips[0] == v1.ClusterIPNone {
		return netip.Addr{}, false
	}
	// The API keeps these consistent; a hand-written object may not.
	// clusterIPs wins, as in kube-proxy, and the conflict is said.
	if spec.ClusterIP != "" && len(spec.ClusterIPs) > 0 && spec.ClusterIP != spec.ClusterIPs[0] {
		t.log.Warn("clusterIP differs from clusterIPs[0]; using clusterIPs", "service", name.String(),
			"clusterIP", spec.ClusterIP, "clusterIPs", spec.ClusterIPs)
	}
	for i, f := range spec.IPFamilies {
		if i >= len(ips) {
			break
		}
		if a, err := parseAddr(ips[i]); err == nil && f != "" && (f == v1.IPv4Protocol) != a.Is4() {
			t.log.Warn("ipFamilies disagrees with the cluster IP's family; going by the address", "service", name.String(),
				"ipFamilies", spec.IPFamilies, "clusterIPs", ips)
			break
		}
	}
	var found netip.Addr
	for i, s := range ips {
		a, err := parseAddr(s)
		if err != nil {
			var declared v1.IPFamily
			if i < len(spec.IPFamilies) {
				declared = spec.IPFamilies[i]
			}
			if guessFamily(s, declared) == t.family {
				t.log.Warn("invalid cluster IP, service skipped", "service", name.String(), "clusterIP", s, "err", err)
				return netip.Addr{}, false
			}
			continue
		}
		if !t.family.Contains(a) {
			continue
		}
		if found.IsValid() {
			if a != found {
				t.log.Warn("several cluster IPs of one family, using the first", "service", name.String(), "clusterIPs", ips)
			}
			continue
		}
		found = a
	}
	return found, found.IsValid()
}

// addrs parses the addresses of the tracker's family in ss, dropping
// invalid ones and duplicates. It returns nil when there are none.
func (t *Tracker) addrs(name model.ServiceName, what string, ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		a, err := parseAddr(s)
		if err != nil {
			t.log.Warn("invalid address, ignored", "service", name.String(), "field", what, "address", s, "err", err)
			continue
		}
		if t.family.Contains(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// lbIPs returns the VIP-mode load-balancer ingress addresses of the
// tracker's family.
func (t *Tracker) lbIPs(name model.ServiceName, ingress []v1.LoadBalancerIngress) []netip.Addr {
	var out []netip.Addr
	for i := range ingress {
		ing := &ingress[i]
		if ing.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
			if *ing.IPMode != v1.LoadBalancerIPModeProxy {
				t.log.Warn("unknown load-balancer ipMode, ingress ignored", "service", name.String(), "ip", ing.IP, "ipMode", *ing.IPMode)
			}
			continue
		}
		a, err := parseAddr(ing.IP)
		if err != nil {
			t.log.Warn("invalid address, ignored", "service", name.String(), "field", "loadBalancer.ingress", "address", ing.IP, "err", err)
			continue
		}
		if t.family.Contains(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// sourceRanges returns the load-balancer source ranges of the tracker's
// family, from the spec field or, when it is empty, from the legacy
// annotation.
func (t *Tracker) sourceRanges(name model.ServiceName, svc *v1.Service) []netip.Prefix {
	ranges := svc.Spec.LoadBalancerSourceRanges
	field := "loadBalancerSourceRanges"
	if len(ranges) == 0 {
		v, ok := svc.Annotations[v1.AnnotationLoadBalancerSourceRangesKey]
		if !ok {
			return nil
		}
		field = v1.AnnotationLoadBalancerSourceRangesKey
		ranges = strings.Split(v, ",")
	}
	var out []netip.Prefix
	for _, s := range ranges {
		if strings.TrimSpace(s) == "" {
			continue
		}
		p, err := parsePrefix(s)
		if err != nil {
			t.log.Warn("invalid source range, ignored", "service", name.String(), "field", field, "range", s, "err", err)
			continue
		}
		if t.family.Contains(p.Addr()) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// affinityTimeout returns the ClientIP affinity timeout of cfg.
func (t *Tracker) affinityTimeout(name model.ServiceName, cfg *v1.SessionAffinityConfig) time.Duration {
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return defaultAffinityTimeout
	}
	s := *cfg.ClientIP.TimeoutSeconds
	if s <= 0 {
		t.log.Warn("invalid session affinity timeout, using the default", "service", name.String(), "timeoutSeconds", s)
		return defaultAffinityTimeout
	}
	return time.Duration(s) * time.Second
}

// servicePortsEqual reports whether two port lists hold equal ports, in
// any order.
func servicePortsEqual(a, b []*model.ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	inB := portLookup(b)
	for _, p := range a {
		q := inB.find(p.Name)
		if q == nil || !servicePortEqual(p, q) {
			return false
		}
	}
	return true
}

// servicePortEqual reports whether two service ports are equal in value.
func servicePortEqual(a, b *model.ServicePort) bool {
	if a == b {
		return true
	}
	return a.Name == b.Name &&
		a.ClusterIP == b.ClusterIP &&
		a.Port == b.Port &&
		a.Protocol == b.Protocol &&
		a.NodePort == b.NodePort &&
		slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		a.SessionAffinity == b.SessionAffinity &&
		a.AffinityTimeout == b.AffinityTimeout &&
		a.ExternalPolicy == b.ExternalPolicy &&
		a.InternalPolicy == b.InternalPolicy &&
		a.TrafficDistribution == b.TrafficDistribution &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		a.Scheduler == b.Scheduler && a.ForwardingMode == b.ForwardingMode
}
