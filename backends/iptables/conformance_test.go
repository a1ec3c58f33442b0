package iptables_test

import (
	"os"
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
	}, proxiertest.Options{})
}

// TestConformanceLegacy runs the suite against iptables-legacy when
// PROXYKIT_IPTABLES_LEGACY=1 is set; it would double the run time of the
// package's tests otherwise.
func TestConformanceLegacy(t *testing.T) {
	if os.Getenv("PROXYKIT_IPTABLES_LEGACY") != "1" {
		t.Skip("set PROXYKIT_IPTABLES_LEGACY=1 to run the suite against iptables-legacy")
	}
	proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		p, err := iptables.New(iptables.Config{Config: cfg, Mode: iptables.ModeLegacy})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, proxiertest.Options{})
}
