package kubeproxy_test

import (
	"slices"
	"testing"
)

// TestRetriesCoverSharedKubeProxySide: a re-probe of the iptables-legacy
// comparison adds tries to kube-proxy's iptables side, which the
// iptables-nft comparison reads too, so that comparison is re-probed as
// well; nftables has a kube-proxy side of its own and is left alone. Each
// comparison comes once.
func TestRetriesCoverSharedKubeProxySide(t *testing.T) {
	s1, s2 := &scenario{name: "s001"}, &scenario{name: "s002"}
	got := sharingKubeProxySide([]cmp{{bIPTLegacy, s1, 3}, {bIPTNFT, s1, 3}, {bNFT, s2, 0}, {bIPTNFT, s2, 1}})
	want := []cmp{{bIPTNFT, s1, 3}, {bIPTLegacy, s1, 3}, {bNFT, s2, 0}, {bIPTNFT, s2, 1}, {bIPTLegacy, s2, 1}}
	if !slices.Equal(got, want) {
		t.Errorf("sharingKubeProxySide = %v, want %v", got, want)
	}
}
