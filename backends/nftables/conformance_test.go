package nftables_test

import (
	"testing"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/proxiertest"
)

// TestConformance runs the shared conformance suite against the nftables
// backend: real traffic through throwaway network namespaces.
func TestConformance(t *testing.T) {
	proxiertest.Run(t, func(t testing.TB, cfg proxier.Config) proxier.Proxier {
		p, err := nftables.New(nftables.Config{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, proxiertest.Options{ServiceCIDRs: true})
}
