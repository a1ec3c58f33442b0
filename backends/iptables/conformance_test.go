package iptables_test

import (
	"testing"

	"github.com/proxykit/proxykit/backends/iptables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformance runs the shared conformance suite against the iptables
// backend, in the flavour the test namespaces use (nft on a host without
// legacy rules): real traffic through throwaway network namespaces.
func TestConformance(t *testing.T) {
	proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		p, err := iptables.New(iptables.Config{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, proxiertest.Options{LocalhostNodePorts: true})
}

// TestConformanceLegacy runs the suite against iptables-legacy, which
// kube-proxy's iptables mode still uses on many hosts.
func TestConformanceLegacy(t *testing.T) {
	proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		p, err := iptables.New(iptables.Config{Config: cfg, Mode: iptables.ModeLegacy})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, proxiertest.Options{LocalhostNodePorts: true})
}
