package ipvs

import (
	"fmt"
	"strings"
	"time"

	"github.com/proxykit/proxykit/proxier"
)

// Defaults of [Config].
const (
	// DefaultScheduler is [proxier.SchedulerRoundRobin], as kube-proxy's.
	DefaultScheduler                  = "rr"
	DefaultInterfaceName              = "proxykit-ipvs0"
	DefaultTableName                  = "proxykit-ipvs"
	DefaultGracefulTerminationTimeout = 15 * time.Minute
)

// Schedulers returns, in a new slice, the schedulers the backend
// implements: every [proxier.Scheduler] but [proxier.SchedulerRandom],
// each by the name of its kernel module (ip_vs_NAME).
func Schedulers() []proxier.Scheduler {
	return []proxier.Scheduler{
		proxier.SchedulerRoundRobin, proxier.SchedulerWeightedRoundRobin, proxier.SchedulerLeastConnection,
		proxier.SchedulerWeightedLeastConnection, proxier.SchedulerLocalityLeastConnection,
		proxier.SchedulerLocalityLeastConnectionReplication, proxier.SchedulerDestinationHashing,
		proxier.SchedulerSourceHashing, proxier.SchedulerShortestExpectedDelay, proxier.SchedulerNeverQueue,
		proxier.SchedulerMaglev,
	}
}

// Config configures the IPVS backend. The zero value is valid.
type Config struct {
	proxier.Config

	// Scheduler is the IPVS scheduler of the virtual servers whose
	// service port asks for none of its own, one of [Schedulers]
	// ("maglev" is taken as [proxier.SchedulerMaglev]). Empty means
	// [DefaultScheduler] (round robin); another name fails New with an
	// [*proxier.UnsupportedError].
	Scheduler proxier.Scheduler
	// InterfaceName is the dummy interface that holds the service
	// addresses. Empty means [DefaultInterfaceName].
	InterfaceName string
	// StrictARP sets arp_ignore=1 and arp_announce=2 for all interfaces
	// of the namespace, so the node does not answer ARP requests for
	// the service addresses it holds on the dummy interface (needed
	// when a layer-2 load balancer announces them). IPv4 only.
	StrictARP bool
	// TableName names the nftables table the backend owns in each
	// family ("ip NAME", "ip6 NAME"). Empty means [DefaultTableName].
	TableName string
	// MasqueradeBit is the packet mark bit that asks for masquerading
	// in postrouting. Zero means [proxier.DefaultMasqueradeBit] (kube-proxy's).
	MasqueradeBit uint32
	// GracefulTerminationTimeout bounds how long a removed TCP real
	// server keeps weight 0 while its connections drain before it is
	// deleted. Zero means [DefaultGracefulTerminationTimeout]; a
	// negative value deletes removed real servers at once.
	GracefulTerminationTimeout time.Duration
	// TCPTimeout, TCPFinTimeout and UDPTimeout set IPVS's connection
	// timeouts (ipvsadm --set) of the namespace; zero leaves the
	// kernel's value.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}

// WithDefaults returns c with every zero field that has a default filled in.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.Scheduler == "" {
		c.Scheduler = DefaultScheduler
	}
	if c.InterfaceName == "" {
		c.InterfaceName = DefaultInterfaceName
	}
	if c.TableName == "" {
		c.TableName = DefaultTableName
	}
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = proxier.DefaultMasqueradeBit
	}
	if c.GracefulTerminationTimeout == 0 {
		c.GracefulTerminationTimeout = DefaultGracefulTerminationTimeout
	}
	return c
}

// validate checks a configuration with defaults filled in, and puts its
// Scheduler in canonical form.
func (c *Config) validate() error {
	s, err := proxier.ResolveScheduler("ipvs", c.Scheduler, Schedulers())
	if err != nil {
		return err
	}
	c.Scheduler = s
	if bits := c.MasqueradeBit; bits&(bits-1) != 0 {
		return fmt.Errorf("ipvs: masquerade bit %#x is not a single bit", bits)
	}
	if n := len(c.InterfaceName); n == 0 || n > 15 || strings.ContainsAny(c.InterfaceName, "/ \t\n") {
		return fmt.Errorf("ipvs: invalid interface name %q", c.InterfaceName)
	}
	if len(c.TableName) > 200 {
		return fmt.Errorf("ipvs: table name too long")
	}
	return nil
}
