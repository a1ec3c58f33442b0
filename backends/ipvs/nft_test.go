package ipvs

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

func TestKeyEncoding(t *testing.T) {
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		fi := newFamily(f, "t")
		a := "10.96.0.1"
		if f == model.IPv6 {
			a = "fd00::1"
		}
		k := vsKey{netip.MustParseAddr(a), model.SCTP, 30077}
		b := fi.keyBytes(k)
		if uint32(len(b)) != fi.set(setVirtual).Key.Len() {
			t.Errorf("%v: key of %d bytes for a set of %d", f, len(b), fi.set(setVirtual).Key.Len())
		}
		got, ok := fi.decodeKey(b)
		if !ok || got != k {
			t.Errorf("%v: decoded %v, want %v", f, got, k)
		}
	}
	fi := newFamily(model.IPv4, "t")
	want := []byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}
	if got := fi.keyBytes(vsKey{netip.MustParseAddr("10.96.0.1"), model.TCP, 80}); !bytes.Equal(got, want) {
		t.Errorf("key %v, want %v", got, want)
	}
}

func TestFirewallElementRange(t *testing.T) {
	fi := newFamily(model.IPv4, "t")
	e := fi.element(elem{Set: setFirewallOK, Key: vsKey{netip.MustParseAddr("203.0.113.9"), model.TCP, 80}, Src: netip.MustParsePrefix("198.51.100.0/23")})
	if got := e.Key[12:]; !bytes.Equal(got, []byte{198, 51, 100, 0}) {
		t.Errorf("range start %v", got)
	}
	if got := e.KeyEnd[12:]; !bytes.Equal(got, []byte{198, 51, 101, 255}) {
		t.Errorf("range end %v", got)
	}
	if got := nftnl.LastAddr(netip.MustParsePrefix("2001:db8::/32")); got != netip.MustParseAddr("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff") {
		t.Errorf("last address %v", got)
	}
	if got := fi.mask(20); !bytes.Equal(got, []byte{255, 255, 240, 0}) {
		t.Errorf("mask %v", got)
	}
}

func TestSkeletonHasEveryChain(t *testing.T) {
	for _, cfg := range []Config{{}, {}} {
		cfg = cfg.WithDefaults()
		fi := newFamily(model.IPv6, cfg.TableName)
		cfg.ClusterCIDRs = nil
		seen := map[string]bool{}
		for _, d := range fi.skeleton(&cfg) {
			seen[d.name] = true
			if len(d.rules) == 0 {
				t.Errorf("chain %s has no rules", d.name)
			}
		}
		for _, c := range []string{chainInput, chainOutput, chainPostrouting, chainServices, chainFirewall} {
			if !seen[c] {
				t.Errorf("no chain %s", c)
			}
		}
		cfg.MasqueradeAll = true
		if n := len(fi.skeleton(&cfg)); n != len(seen)+1 {
			t.Errorf("masquerade-all skeleton has %d chains, want %d (with mark-cluster)", n, len(seen)+1)
		}
	}
}
