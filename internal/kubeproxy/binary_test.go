package kubeproxy_test

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/proxykit/proxykit/internal/kubeproxy"
)

// TestVersionMatchesBuild checks that the version the helper looks for is
// the one the build script builds, and that every staging module is
// replaced by its release of the same version.
func TestVersionMatchesBuild(t *testing.T) {
	b, err := os.ReadFile("../../hack/kubeproxy/oracle/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no k8s.io/kubernetes requirement in hack/kubeproxy/oracle/go.mod")
	}
	if got := string(m[1]); got != kubeproxy.KubernetesVersion {
		t.Errorf("hack/kubeproxy/oracle/go.mod pins %s, kubeproxy.KubernetesVersion is %s", got, kubeproxy.KubernetesVersion)
	}
	staging := "v0" + kubeproxy.KubernetesVersion[len("v1"):]
	var wrong []string
	for _, r := range regexp.MustCompile(`(?m)^\s*(k8s\.io/\S+)\s+=>\s+k8s\.io/\S+\s+(v\S+)`).FindAllSubmatch(b, -1) {
		if string(r[2]) != staging {
			wrong = append(wrong, string(r[1])+" => "+string(r[2]))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("replacements not at %s: %v", staging, wrong)
	}
	if !regexp.MustCompile(`(?m)^\s*k8s\.io/kube-proxy\s+=>`).Match(b) {
		t.Errorf("no replacement of k8s.io/kube-proxy")
	}
}

// TestArgs checks the command line built from Options.
func TestArgs(t *testing.T) {
	bit, lnp := 5, false
	got := kubeproxy.Options{
		Mode:               kubeproxy.IPTables,
		NodeIPs:            addrs("10.0.0.1", "fd00::1"),
		HostnameOverride:   "node1",
		ClusterCIDRs:       prefixes("10.244.0.0/16", "fd00:244::/48"),
		NodePortAddresses:  []string{"primary"},
		MasqueradeAll:      true,
		MasqueradeBit:      &bit,
		LocalhostNodePorts: &lnp,
		ServiceCIDRs:       prefixes("10.96.0.0/16"),
		NodeLabels:         map[string]string{"topology.kubernetes.io/zone": "a", "b": "c"},
		FeatureGates:       map[string]bool{"X": true},
		Verbosity:          2,
		ExtraArgs:          []string{"--extra"},
	}.Args()
	want := []string{
		"--proxy-mode=iptables",
		"--node-ips=10.0.0.1,fd00::1",
		"--hostname-override=node1",
		"--cluster-cidr=10.244.0.0/16,fd00:244::/48",
		"--nodeport-addresses=primary",
		"--masquerade-all=true",
		"--masquerade-bit=5",
		"--iptables-localhost-nodeports=false",
		"--service-cidrs=10.96.0.0/16",
		"--node-labels=b=c,topology.kubernetes.io/zone=a",
		"--feature-gates=X=true",
		"--v=2",
		"--extra",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Args:\n got %q\nwant %q", got, want)
	}
	if got := (kubeproxy.Options{NodeIPs: addrs("10.0.0.1")}).Args(); !slices.Equal(got, []string{"--proxy-mode=nftables", "--node-ips=10.0.0.1"}) {
		t.Errorf("Args of the defaults: %q", got)
	}
}
