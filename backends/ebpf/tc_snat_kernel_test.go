package ebpf

import (
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testnet"
	"github.com/proxykit/proxykit/model"
)

// TestTCSNATPortsReused: with NorthSouthSNATPorts of two ports, a client
// outside the cluster opens many TCP connections, one after the other,
// to a node port whose only endpoint runs on node2 (SNATed to node1).
// Each closed connection (a FIN each way) gives its port to the next:
// every connection is answered, and the endpoint only ever sees the two
// configured source ports. Without the reuse, the third connection finds
// no free port and its SYNs are dropped.
func TestTCSNATPortsReused(t *testing.T) {
	forFamilies(t, func(t *testing.T, f model.IPFamily) {
		testnet.RequireCommand(t, "nft")
		x := &tcFixture{fixture: newFixture(t, f, func(c *Config) {
			c.SocketOnly = false
			c.NorthSouth = NorthSouthTC
			c.NorthSouthSNATPorts = [2]uint16{61000, 61001}
		})}
		x.client = x.tn.Client
		remote := x.localEps(8080, x.p21)
		s := svc("np", model.TCP, vip(f, 10), 80).WithTargets(remote, remote, true)
		s.Port.NodePort = 30080
		x.sync([]testSvc{s})
		d := ap(x.tn.Node1.ExternalIP(f), 30080)
		for i := range 12 {
			r := x.client.TCP(d, 3*time.Second)
			if r.Outcome != testnet.Answered || r.Server != x.p21.Name {
				t.Fatalf("connection %d: client -> %s: %v, want an answer from %s", i, d, r, x.p21.Name)
			}
			if r.Source.Addr().Unmap() != x.tn.Node1.IP(f) || r.Source.Port() < 61000 || r.Source.Port() > 61001 {
				t.Errorf("connection %d: the endpoint saw source %s, want %s port 61000 or 61001", i, r.Source, x.tn.Node1.IP(f))
			}
		}
	})
}

// TestSNATPortsConfig: a NorthSouthSNATPorts that is not a range fails
// the configuration with the range in the message.
func TestSNATPortsConfig(t *testing.T) {
	for _, c := range []struct {
		in     [2]uint16
		lo, hi uint16
		ok     bool
	}{
		{[2]uint16{}, DefaultSNATPortMin, DefaultSNATPortMax, true},
		{[2]uint16{40000, 40000}, 40000, 40000, true},
		{[2]uint16{0, 100}, 0, 0, false},
		{[2]uint16{5000, 4000}, 0, 0, false},
	} {
		cfg := Config{NorthSouthSNATPorts: c.in}
		lo, hi, err := cfg.snatPorts()
		if (err == nil) != c.ok || lo != c.lo || hi != c.hi {
			t.Errorf("snatPorts(%v) = %d, %d, %v", c.in, lo, hi, err)
		}
	}
}
