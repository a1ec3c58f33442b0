package proxier

import (
	"slices"

	"github.com/proxykit/proxykit/model"
)

// Topology is where this proxier runs, for endpoint selection.
type Topology struct {
	// NodeName is this node's name.
	NodeName string
	// Zone is this node's topology.kubernetes.io/zone label, or empty.
	Zone string
}

// SelectTargets picks the endpoints of one service port that traffic on
// this node may use, the way kube-proxy does:
//
//   - Cluster traffic uses ready endpoints, narrowed by topology: node
//     hints (when every ready endpoint has them and one names this node),
//     else zone hints (when every ready endpoint has them and one names
//     this zone). A service with a trafficDistribution whose ready
//     endpoints carry no hints at all is narrowed directly: PreferSameNode
//     to ready local endpoints, PreferSameZone to ready endpoints in this
//     zone, when there are any. With no ready endpoint left, serving
//     terminating endpoints are used instead.
//   - Local traffic (a Local policy) uses ready local endpoints, or
//     serving terminating local endpoints when none is ready.
//   - HasEndpoints is false only when no endpoint is usable at all, so
//     that traffic is rejected; an empty list with HasEndpoints set means
//     the policy found nothing on this node, so traffic is dropped.
//
// eps must not be modified; the returned lists share its elements, and
// a list that keeps every endpoint of eps is eps itself.
func SelectTargets(sp *model.ServicePort, eps []*model.Endpoint, topo Topology) *Targets {
	internalLocal := sp.InternalLocal()
	externalLocal := sp.ExternalLocal()
	usesCluster := !internalLocal || (sp.ExternallyAccessible() && !externalLocal)
	usesLocal := internalLocal || externalLocal

	t := &Targets{}
	var cluster, local []*model.Endpoint
	if usesCluster {
		cluster = clusterEndpoints(sp, eps, topo)
		if len(cluster) > 0 {
			t.HasEndpoints = true
		}
	}
	if usesLocal {
		var anyUsable bool
		local, anyUsable = localEndpoints(eps)
		if anyUsable {
			t.HasEndpoints = true
		}
	}
	if internalLocal {
		t.Internal = local
	} else {
		t.Internal = cluster
	}
	if sp.ExternallyAccessible() {
		if externalLocal {
			t.External = local
		} else {
			t.External = cluster
		}
		if externalLocal && internalLocal {
			// Pods and the node reach the external addresses through
			// the cluster-wide endpoints, whatever the internal policy
			// (kube-proxy's short-circuit to its cluster policy chain).
			t.Cluster = clusterEndpoints(sp, eps, topo)
			if t.Cluster == nil {
				t.Cluster = []*model.Endpoint{}
			}
			if len(t.Cluster) > 0 {
				t.HasEndpoints = true
			}
		}
	}
	return t
}

func clusterEndpoints(sp *model.ServicePort, eps []*model.Endpoint, topo Topology) []*model.Endpoint {
	keep := topologyFilter(sp, eps, topo)
	out := filter(eps, func(ep *model.Endpoint) bool { return ep.Ready && keep(ep) })
	if len(out) == 0 {
		out = filter(eps, func(ep *model.Endpoint) bool { return ep.Serving && ep.Terminating })
	}
	return out
}

// topologyFilter returns the predicate topology imposes on ready cluster
// endpoints.
func topologyFilter(sp *model.ServicePort, eps []*model.Endpoint, topo Topology) func(*model.Endpoint) bool {
	all := func(*model.Endpoint) bool { return true }
	allNodeHints, allZoneHints, anyHints := true, true, false
	forNode, forZone, anyLocal, anyZone := false, false, false, false
	nready := 0
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		nready++
		if len(ep.NodeHints) == 0 {
			allNodeHints = false
		} else {
			anyHints = true
			if topo.NodeName != "" && slices.Contains(ep.NodeHints, topo.NodeName) {
				forNode = true
			}
		}
		if len(ep.ZoneHints) == 0 {
			allZoneHints = false
		} else {
			anyHints = true
			if topo.Zone != "" && slices.Contains(ep.ZoneHints, topo.Zone) {
				forZone = true
			}
		}
		if ep.Local {
			anyLocal = true
		}
		if topo.Zone != "" && ep.Zone == topo.Zone {
			anyZone = true
		}
	}
	if nready == 0 {
		return all
	}
	switch {
	case allNodeHints && forNode:
		return func(ep *model.Endpoint) bool { return slices.Contains(ep.NodeHints, topo.NodeName) }
	case allZoneHints && forZone:
		return func(ep *model.Endpoint) bool { return slices.Contains(ep.ZoneHints, topo.Zone) }
	case anyHints:
		// Hints present but incomplete or not for us: use everything,
		// as kube-proxy does.
		return all
	}
	switch sp.TrafficDistribution {
	case model.PreferSameNode:
		if anyLocal {
			return func(ep *model.Endpoint) bool { return ep.Local }
		}
		if anyZone {
			return func(ep *model.Endpoint) bool { return ep.Zone == topo.Zone }
		}
	case model.PreferSameZone:
		if anyZone {
			return func(ep *model.Endpoint) bool { return ep.Zone == topo.Zone }
		}
	}
	return all
}

// localEndpoints returns the local endpoints Local policies use, and
// whether any endpoint at all (local or not) is usable.
func localEndpoints(eps []*model.Endpoint) ([]*model.Endpoint, bool) {
	var anyUsable, localReady, localTerminating bool
	for _, ep := range eps {
		switch {
		case ep.Ready:
			anyUsable = true
			localReady = localReady || ep.Local
		case ep.Serving && ep.Terminating:
			anyUsable = true
			localTerminating = localTerminating || ep.Local
		}
	}
	switch {
	case localReady:
		return filter(eps, func(ep *model.Endpoint) bool { return ep.Local && ep.Ready }), anyUsable
	case localTerminating:
		return filter(eps, func(ep *model.Endpoint) bool { return ep.Local && ep.Serving && ep.Terminating }), anyUsable
	}
	return nil, anyUsable
}

// filter returns the endpoints of eps that keep selects, in order, or
// nil when there are none. When it selects every one, which is the usual
// case, the result is eps itself (its capacity cut to its length, so that
// an append copies it): the tracker never modifies a published list, and
// 100,000 service ports select their targets with no allocation.
func filter(eps []*model.Endpoint, keep func(*model.Endpoint) bool) []*model.Endpoint {
	n := 0
	for _, ep := range eps {
		if keep(ep) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps[:n:n]
	}
	out := make([]*model.Endpoint, 0, n)
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// Equal reports whether t and o select the same endpoints (by identity of
// the endpoint values) with the same HasEndpoints.
func (t *Targets) Equal(o *Targets) bool {
	if t == nil || o == nil {
		return t == o
	}
	return t.HasEndpoints == o.HasEndpoints && slices.Equal(t.Internal, o.Internal) && slices.Equal(t.External, o.External) &&
		(t.Cluster == nil) == (o.Cluster == nil) && slices.Equal(t.Cluster, o.Cluster)
}
