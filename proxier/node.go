package proxier

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"

	"github.com/proxykit/proxykit/internal/conntrack"
	"github.com/proxykit/proxykit/internal/healthcheck"
	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// Node holds what the proxiers of one network namespace use beside their
// backends: the namespace handle, the conntrack connection that deletes
// stale flows, and the HTTP servers of the health check node ports. The
// engine orchestrates; it does not need to own these.
//
// Give one Node to every proxier of a namespace ([Config.Node]) and they
// share it: one conntrack connection, and each health check node port
// served once, answering for all of them (a Service two proxiers serve,
// one per IP family say, reports the larger count of local endpoints).
// Without a Node, each proxier opens its own, as if it were alone.
//
// The caller closes a Node it made, after the proxiers that use it.
type Node struct {
	ns  *netns.NS
	log *slog.Logger
	// healthAddrs are the addresses health check node ports open on (nil:
	// all); noHealthAddr is set when NodePortAddresses select none.
	healthAddrs  []netip.Addr
	noHealthAddr bool

	mu     sync.Mutex
	closed bool
	ct     *conntrack.Cleaner // opened on first use
	ctMu   sync.Mutex         // one cleanup at a time on ct
	hc     serviceHealthServers
	users  map[*Engine]*nodeUser
	served map[model.ServiceName]healthcheck.ServiceHealth
}

// nodeUser is what one engine asks of the Node's health check servers.
type nodeUser struct {
	want    map[model.ServiceName]healthcheck.ServiceHealth
	healthy func() bool
}

// NodeConfig configures a [Node]. The zero value is the caller's own
// namespace, with health check node ports on every address.
type NodeConfig struct {
	// NetNS is the path of the network namespace, as in [Config.NetNS].
	NetNS string
	// NodePortAddresses select the addresses health check node ports
	// open on, as in [Config.NodePortAddresses] (resolved now: addresses
	// added later are not served). Empty means every address.
	NodePortAddresses []netip.Prefix
	// Logger receives the Node's logs. Nil discards them.
	Logger *slog.Logger
}

// NewNode opens the namespace cfg names. The conntrack connection and the
// health check servers open when a proxier first needs them.
func NewNode(cfg NodeConfig) (*Node, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("proxier: %w", err)
	}
	n := &Node{ns: ns, log: log, users: map[*Engine]*nodeUser{}}
	if len(cfg.NodePortAddresses) > 0 {
		// Like node ports, health check node ports open only on the
		// NodePortAddresses.
		if n.healthAddrs, err = healthcheck.AddrsIn(ns, cfg.NodePortAddresses); err != nil {
			ns.Close()
			return nil, fmt.Errorf("proxier: %w", err)
		}
		n.noHealthAddr = len(n.healthAddrs) == 0
	}
	return n, nil
}

// NetNS returns the path of the Node's namespace (empty: the caller's).
func (n *Node) NetNS() string { return n.ns.Path() }

// Close closes the conntrack connection, the health check servers and the
// namespace handle.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	if n.hc != nil {
		n.hc.Close()
	}
	if n.ct != nil {
		n.ctMu.Lock()
		n.ct.Close()
		n.ctMu.Unlock()
	}
	return n.ns.Close()
}

// cleanConntrack runs one conntrack cleanup, opening the connection the
// first time.
func (n *Node) cleanConntrack(f model.IPFamily, valid conntrack.Valid) (int, error) {
	if err := n.openConntrack(); err != nil {
		return 0, err
	}
	n.mu.Lock()
	ct := n.ct
	n.mu.Unlock()
	n.ctMu.Lock()
	defer n.ctMu.Unlock()
	return ct.Clean(f, valid)
}

// openConntrack opens the conntrack connection now, so that a proxier
// that needs it fails at its start rather than at its first sync.
func (n *Node) openConntrack() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("proxier: node is closed")
	}
	if n.ct != nil {
		return nil
	}
	ct, err := conntrack.Open(n.ns)
	if err != nil {
		return fmt.Errorf("proxier: %w", err)
	}
	n.ct = ct
	return nil
}

// serviceHealth returns e's view of the Node's health check servers, nil
// when NodePortAddresses select no address of the namespace. healthy
// reports whether e is healthy: a server answers 200 only while every
// proxier using it is.
func (n *Node) serviceHealth(e *Engine, healthy func() bool) serviceHealthServers {
	if n.noHealthAddr {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.users[e] = &nodeUser{healthy: healthy}
	if n.hc == nil {
		n.hc = healthcheck.NewServiceServers(n.ns, n.healthAddrs, n.healthy, n.log)
	}
	return nodeHealth{n, e}
}

// healthy reports whether every proxier using the health check servers is.
func (n *Node) healthy() bool {
	n.mu.Lock()
	users := make([]*nodeUser, 0, len(n.users))
	for _, u := range n.users {
		users = append(users, u)
	}
	n.mu.Unlock()
	for _, u := range users {
		if !u.healthy() {
			return false
		}
	}
	return true
}

// syncHealth records what e wants served and makes the servers answer
// what every user wants.
func (n *Node) syncHealth(e *Engine, want map[model.ServiceName]healthcheck.ServiceHealth, leave bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.hc == nil {
		return nil
	}
	if leave {
		delete(n.users, e)
	} else if u := n.users[e]; u != nil {
		u.want = want
	}
	all := map[model.ServiceName]healthcheck.ServiceHealth{}
	for _, u := range n.users {
		for name, h := range u.want {
			if o, ok := all[name]; ok {
				h.LocalEndpoints = max(h.LocalEndpoints, o.LocalEndpoints)
			}
			all[name] = h
		}
	}
	if maps.Equal(all, n.served) {
		return nil
	}
	err := n.hc.Sync(all)
	if err == nil {
		n.served = all
	} else {
		n.served = nil // try again next time
	}
	return err
}

// nodeHealth is one engine's handle on its Node's health check servers.
type nodeHealth struct {
	n *Node
	e *Engine
}

func (h nodeHealth) Sync(want map[model.ServiceName]healthcheck.ServiceHealth) error {
	return h.n.syncHealth(h.e, want, false)
}

func (h nodeHealth) Close() { _ = h.n.syncHealth(h.e, nil, true) }
