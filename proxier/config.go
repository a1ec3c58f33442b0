package proxier

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/model"
)

// Config configures the engine and carries the dataplane options every
// backend shares. Backend packages embed it in their own Config. The zero
// value is valid: it programs the caller's own network namespace, for both
// IP families, with kube-proxy's default intervals.
type Config struct {
	// NetNS is the path of the network namespace to program, e.g.
	// /var/run/netns/pod1 or /proc/1234/ns/net. Empty means the caller's
	// own namespace.
	NetNS string
	// Node, when set, holds the namespace's handle, conntrack connection
	// and health check servers, shared with the other proxiers given it
	// (see [Node]); NetNS is then its namespace (empty: taken from it).
	// Nil means the proxier opens its own.
	Node *Node
	// NodeName is this node's name; endpoints on it are local. Empty
	// means no endpoint is local.
	NodeName string
	// Families are the IP families to program. Empty means IPv4 and IPv6.
	Families []model.IPFamily
	// ServiceProxyName, when set, makes the proxier handle exactly the
	// Services labelled service.kubernetes.io/service-proxy-name with this
	// value; when empty it handles the Services without that label.
	ServiceProxyName string

	// MinSyncInterval is the least time between two syncs; events within
	// it coalesce. Zero means 1s.
	MinSyncInterval time.Duration
	// SyncPeriod is the interval of full resyncs. Zero means 30s.
	SyncPeriod time.Duration
	// RetryInterval is the first wait after a failed sync; it doubles on
	// each further failure up to SyncPeriod. Zero means 1s.
	RetryInterval time.Duration

	// ClusterCIDRs are the pod networks. Traffic to a service from outside
	// them is masqueraded. Empty means: masquerade only what must be
	// (hairpin and external traffic with policy Cluster).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all service traffic.
	MasqueradeAll bool
	// NodePortAddresses select the node addresses node ports open on.
	// Empty means every local address of the namespace.
	NodePortAddresses []netip.Prefix
	// NodeIPs are the node's primary addresses, at most one per family:
	// what kube-proxy takes from --bind-address or the Node object's
	// addresses. As in kube-proxy, a loadBalancerSourceRanges entry that
	// holds the node's address of its family also admits the service's
	// load-balancer IPs as sources (the node, or a proxy-mode load
	// balancer, reaching the VIP from the VIP). Empty means the first
	// InternalIP (else ExternalIP) of each family the Node object lists;
	// without either, source ranges admit exactly what they list.
	NodeIPs []netip.Addr
	// ServiceCIDRs are fixed service ranges (the API server's
	// --service-cluster-ip-range), added to those of the ServiceCIDR
	// objects delivered to [ServiceCIDRHandler]. Backends that can drop
	// traffic to unallocated addresses in them, as kube-proxy's nftables
	// mode does (nftables, eBPF); iptables and IPVS ignore them, as
	// kube-proxy's modes of those names do.
	ServiceCIDRs []netip.Prefix

	// NoConntrackCleanup turns off the deletion of stale UDP and SCTP
	// conntrack flows after each sync (for backends that need none, and
	// for tests that run in the caller's own namespace).
	NoConntrackCleanup bool
	// NoServiceHealthChecks turns off the HTTP servers on the
	// healthCheckNodePort of Services with externalTrafficPolicy Local.
	NoServiceHealthChecks bool
	// ServiceHealthError, when set, is called from the sync loop for each
	// health check node port that could not be opened, at each attempt
	// (the port is tried again at every sync until it opens), as
	// kube-proxy records a FailedToStartServiceHealthcheck event each
	// time.
	ServiceHealthError func(svc model.ServiceName, port uint16, err error)
	// HealthTimeout is how long an event may wait to be programmed before
	// the proxier reports itself unhealthy (see [HealthHandler]). The
	// first sync counts as pending from New, so a proxier whose initial
	// Service and EndpointSlice lists do not arrive within it turns
	// unhealthy too. Zero means DefaultHealthTimeout.
	HealthTimeout time.Duration

	// Logger receives the proxier's logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the proxier's metrics. Nil registers none.
	// Proxiers that share one Registerer need distinct Names; New fails
	// on any other registration error.
	Registerer prometheus.Registerer
	// Name tells this proxier from others in one process (a CNI agent's
	// proxier per pod network, say): when set, its metrics carry the
	// label proxier=Name and its logs the attribute proxier. Proxiers
	// with one Name on one Registerer (a successor of a closed proxier)
	// share the metrics.
	Name string
}

// DefaultMasqueradeBit is the packet mark bit that asks for masquerading
// in postrouting, in the backends that mark (kube-proxy's
// --iptables-masquerade-bit 14).
const DefaultMasqueradeBit = 0x4000

// Default intervals.
const (
	DefaultMinSyncInterval = time.Second
	DefaultSyncPeriod      = 30 * time.Second
	DefaultRetryInterval   = time.Second
)

// PrimaryNodeIP returns the node's primary address of family f: the
// configured one (Config.NodeIPs), else the first the Node object lists
// (req.NodeIPs), else the zero Addr.
func PrimaryNodeIP(c Config, req *SyncRequest, f model.IPFamily) netip.Addr {
	if a := c.NodeIP(f); a.IsValid() {
		return a
	}
	if req != nil {
		for _, a := range req.NodeIPs {
			if f.Contains(a) {
				return a.Unmap()
			}
		}
	}
	return netip.Addr{}
}

// NodeIP returns the first of NodeIPs in family f, or the zero Addr.
func (c Config) NodeIP(f model.IPFamily) netip.Addr {
	for _, a := range c.NodeIPs {
		if f.Contains(a) {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// MetricLabels returns the constant labels of the proxier's metrics:
// extra, plus proxier=Name when Name is set.
func (c Config) MetricLabels(extra prometheus.Labels) prometheus.Labels {
	l := prometheus.Labels{}
	for k, v := range extra {
		l[k] = v
	}
	if c.Name != "" {
		l["proxier"] = c.Name
	}
	return l
}

// Register registers each collector with reg, if reg is not nil. A
// collector that is already registered (the same metric of a proxier of
// the same Name) is replaced by the registered one in place, so that
// both share it; any other error is returned.
func Register[C prometheus.Collector](reg prometheus.Registerer, cs ...*C) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		err := reg.Register(*c)
		var are prometheus.AlreadyRegisteredError
		switch {
		case errors.As(err, &are):
			existing, ok := are.ExistingCollector.(C)
			if !ok {
				return fmt.Errorf("metrics: %w", err)
			}
			*c = existing
		case err != nil:
			return fmt.Errorf("metrics (proxiers sharing a Registerer need distinct Config.Name): %w", err)
		}
	}
	return nil
}

// WithDefaults returns c with every zero field that has a default filled in.
func (c Config) WithDefaults() Config {
	if c.Node != nil && c.NetNS == "" {
		c.NetNS = c.Node.NetNS()
	}
	if len(c.Families) == 0 {
		c.Families = []model.IPFamily{model.IPv4, model.IPv6}
	}
	if c.MinSyncInterval <= 0 {
		c.MinSyncInterval = DefaultMinSyncInterval
	}
	if c.SyncPeriod <= 0 {
		c.SyncPeriod = DefaultSyncPeriod
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
