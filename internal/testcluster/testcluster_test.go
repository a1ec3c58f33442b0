package testcluster_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/internal/testcluster"
)

// TestVersionMatchesBuild checks that the version the helper looks for is
// the one the build script builds.
func TestVersionMatchesBuild(t *testing.T) {
	b, err := os.ReadFile("../../hack/testcluster/kube-apiserver/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no k8s.io/kubernetes requirement in hack/testcluster/kube-apiserver/go.mod")
	}
	if got := string(m[1]); got != testcluster.KubernetesVersion {
		t.Errorf("hack/testcluster/kube-apiserver/go.mod pins %s, testcluster.KubernetesVersion is %s", got, testcluster.KubernetesVersion)
	}
}

const rbac = `apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects:
- {kind: ServiceAccount, name: reader, namespace: kube-system}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ignored, namespace: kube-system}
`

// TestCluster starts a control plane and checks what the end-to-end tests
// rely on: dual-stack cluster IPs and node ports allocated by the API
// server, a service account limited to its RBAC, and state kept across an
// API server restart.
func TestCluster(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	cs := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	svc, err := cs.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeNodePort,
			IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			Ports:          []v1.ServicePort{{Port: 80}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("cluster IPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	for i, ip := range svc.Spec.ClusterIPs {
		if !netip.MustParsePrefix(c.ServiceCIDRs[i]).Contains(netip.MustParseAddr(ip)) {
			t.Errorf("cluster IP %s not in %s", ip, c.ServiceCIDRs[i])
		}
	}
	if np := svc.Spec.Ports[0].NodePort; np < 30000 || np > 32767 {
		t.Errorf("node port %d", np)
	}

	manifest := filepath.Join(t.TempDir(), "rbac.yaml")
	if err := os.WriteFile(manifest, []byte(rbac), 0o600); err != nil {
		t.Fatal(err)
	}
	applied, err := testcluster.ApplyRBAC(ctx, cs, manifest)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ServiceAccount kube-system/reader", "ClusterRole reader", "ClusterRoleBinding reader"}
	if !slices.Equal(applied, want) {
		t.Errorf("applied %q, want %q", applied, want)
	}
	if _, err := testcluster.ApplyRBAC(ctx, cs, manifest); err != nil {
		t.Errorf("applying again: %v", err)
	}
	kc := c.ServiceAccountKubeconfig(t, "kube-system", "reader")
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	reader := kubernetes.NewForConfigOrDie(cfg)
	if _, err := reader.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the service account may not list services: %v", err)
	}
	_, err = reader.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the service account created a service: %v", err)
	}

	start := time.Now()
	if took, killed, err := c.StopAPIServer(); err != nil || killed {
		t.Fatalf("stop: took %v, killed %v, %v", took, killed, err)
	}
	if _, err := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answers after StopAPIServer")
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %v", time.Since(start).Round(time.Millisecond))
	got, err := reader.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if len(got.Items) == 0 || !slices.ContainsFunc(got.Items, func(s v1.Service) bool {
		return s.Name == "web" && slices.Equal(s.Spec.ClusterIPs, svc.Spec.ClusterIPs)
	}) {
		t.Errorf("after the restart, services %v lack web %v", got.Items, svc.Spec.ClusterIPs)
	}
}
