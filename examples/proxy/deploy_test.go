package main_test

import (
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// deployObjects are the objects of deploy/*.yaml, decoded strictly into
// their API types.
type deployObjects struct {
	serviceAccounts []*v1.ServiceAccount
	clusterRoles    []*rbacv1.ClusterRole
	bindings        []*rbacv1.ClusterRoleBinding
	daemonSets      []*appsv1.DaemonSet
	configMaps      []*v1.ConfigMap
}

func readDeploy(t *testing.T) deployObjects {
	t.Helper()
	files, err := filepath.Glob("deploy/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/*.yaml: %v %v", files, err)
	}
	var objs deployObjects
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s, document %d: %v", file, i, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ServiceAccount":
				o := &v1.ServiceAccount{}
				objs.serviceAccounts, obj = append(objs.serviceAccounts, o), o
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				o := &rbacv1.ClusterRole{}
				objs.clusterRoles, obj = append(objs.clusterRoles, o), o
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				o := &rbacv1.ClusterRoleBinding{}
				objs.bindings, obj = append(objs.bindings, o), o
			case "apps/v1 DaemonSet":
				o := &appsv1.DaemonSet{}
				objs.daemonSets, obj = append(objs.daemonSets, o), o
			case "v1 ConfigMap":
				o := &v1.ConfigMap{}
				objs.configMaps, obj = append(objs.configMaps, o), o
			default:
				t.Fatalf("%s, document %d: unexpected %s %s", file, i, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s, %s: %v", file, tm.Kind, err)
			}
		}
	}
	if len(objs.serviceAccounts) != 1 || len(objs.clusterRoles) != 1 || len(objs.bindings) != 1 ||
		len(objs.daemonSets) != 1 || len(objs.configMaps) != 1 {
		t.Fatalf("want one ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet and ConfigMap; got %d, %d, %d, %d, %d",
			len(objs.serviceAccounts), len(objs.clusterRoles), len(objs.bindings), len(objs.daemonSets), len(objs.configMaps))
	}
	return objs
}

// nodeProxierRules are the rules of kube-proxy's ClusterRole
// system:node-proxier (kubernetes plugin/pkg/auth/authorizer/rbac/
// bootstrappolicy/policy.go, v1.36), which the manifest's own role must
// grant: the daemon watches the same objects and records the same events.
var nodeProxierRules = [][3]string{ // group, resource, verb
	{"", "services", "list"}, {"", "services", "watch"},
	{"", "endpoints", "list"}, {"", "endpoints", "watch"},
	{"", "nodes", "get"}, {"", "nodes", "list"}, {"", "nodes", "watch"},
	{"", "events", "create"}, {"", "events", "patch"}, {"", "events", "update"},
	{"events.k8s.io", "events", "create"}, {"events.k8s.io", "events", "patch"}, {"events.k8s.io", "events", "update"},
	{"networking.k8s.io", "servicecidrs", "list"}, {"networking.k8s.io", "servicecidrs", "watch"},
	{"discovery.k8s.io", "endpointslices", "list"}, {"discovery.k8s.io", "endpointslices", "watch"},
}

// TestDeployRBAC checks that the ClusterRole grants what
// system:node-proxier grants, nothing more, and that it is bound to the
// DaemonSet's ServiceAccount.
func TestDeployRBAC(t *testing.T) {
	objs := readDeploy(t)
	role, binding, sa, ds := objs.clusterRoles[0], objs.bindings[0], objs.serviceAccounts[0], objs.daemonSets[0]
	granted := map[[3]string]bool{}
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: resource names or URLs", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted[[3]string{g, res, v}] = true
				}
			}
		}
	}
	for _, want := range nodeProxierRules {
		if !granted[want] {
			t.Errorf("the ClusterRole does not allow %s %q %s", want[2], want[0], want[1])
		}
		delete(granted, want)
	}
	for extra := range granted {
		t.Errorf("the ClusterRole allows %s %q %s, which system:node-proxier does not", extra[2], extra[0], extra[1])
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
		t.Errorf("the binding refers to %+v", binding.RoleRef)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}
	if !slices.Contains(binding.Subjects, want) {
		t.Errorf("the binding's subjects %+v lack %+v", binding.Subjects, want)
	}
	if ds.Spec.Template.Spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("the DaemonSet runs as %s/%s, not %s/%s", ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
}

// TestDeployDaemonSet checks the pod against kubeadm's kube-proxy
// DaemonSet (kubernetes cmd/kubeadm/app/phases/addons/proxy/manifests.go):
// host network, privileged, system-node-critical, every taint tolerated,
// Linux nodes, the xtables lock and the modules mounted from the host,
// the configuration from the ConfigMap, the node name from the downward
// API.
func TestDeployDaemonSet(t *testing.T) {
	objs := readDeploy(t)
	ds, cm := objs.daemonSets[0], objs.configMaps[0]
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("not on the host network")
	}
	// ClusterFirstWithHostNet would resolve through the cluster DNS
	// Service, which needs a service proxy.
	if spec.DNSPolicy != "" && spec.DNSPolicy != v1.DNSClusterFirst && spec.DNSPolicy != v1.DNSDefault {
		t.Errorf("DNS policy %s", spec.DNSPolicy)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %q", spec.PriorityClassName)
	}
	if !slices.Contains(spec.Tolerations, v1.Toleration{Operator: v1.TolerationOpExists}) {
		t.Errorf("tolerations %+v do not tolerate every taint", spec.Tolerations)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("node selector %v", spec.NodeSelector)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %s", ds.Spec.UpdateStrategy.Type)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.Privileged, false) {
		t.Error("not privileged")
	}

	// The node name and the configuration file.
	if !slices.Contains(c.Args, "--hostname-override=$(NODE_NAME)") {
		t.Errorf("args %q lack --hostname-override=$(NODE_NAME)", c.Args)
	}
	env := map[string]v1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if f := env["NODE_NAME"].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME is not the downward API's spec.nodeName: %+v", env["NODE_NAME"])
	}
	// The in-cluster client must not go through the kubernetes Service.
	if env["KUBERNETES_SERVICE_HOST"].Value == "" || env["KUBERNETES_SERVICE_PORT"].Value == "" {
		t.Error("KUBERNETES_SERVICE_HOST/PORT are not set to the API server's own address")
	}
	var config string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			config = v
		}
	}
	if config != "/var/lib/proxykit/config.conf" {
		t.Fatalf("--config=%q", config)
	}

	mounts := map[string]v1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]v1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	hostPath := func(mountPath, want string, typ v1.HostPathType, readOnly bool) {
		t.Helper()
		m, ok := mounts[mountPath]
		if !ok {
			t.Errorf("%s is not mounted", mountPath)
			return
		}
		hp := volumes[m.Name].HostPath
		if hp == nil || hp.Path != want || ptr.Deref(hp.Type, "") != typ || m.ReadOnly != readOnly {
			t.Errorf("%s: mount %+v of %+v, want host path %s (type %q, read-only %v)", mountPath, m, hp, want, typ, readOnly)
		}
	}
	hostPath("/run/xtables.lock", "/run/xtables.lock", v1.HostPathFileOrCreate, false)
	hostPath("/lib/modules", "/lib/modules", "", true)

	m, ok := mounts[path.Dir(config)]
	if !ok {
		t.Fatalf("%s is not mounted", path.Dir(config))
	}
	src := volumes[m.Name].ConfigMap
	if src == nil || src.Name != cm.Name || cm.Namespace != ds.Namespace {
		t.Fatalf("%s comes from %+v, not ConfigMap %s/%s", path.Dir(config), volumes[m.Name], cm.Namespace, cm.Name)
	}
	if _, ok := cm.Data[path.Base(config)]; !ok {
		t.Errorf("ConfigMap %s has no key %s", cm.Name, path.Base(config))
	}

	// The probe and the ports follow the configuration.
	kp := readKubeProxyConfiguration(t, cm.Data[path.Base(config)])
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, addr := range map[string]string{"metrics": kp.MetricsBindAddress, "healthz": kp.HealthzBindAddress} {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s address %q: %v", name, addr, err)
			continue
		}
		if strconv.Itoa(int(ports[name])) != port {
			t.Errorf("container port %s is %d, the configuration says %s", name, ports[name], addr)
		}
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/livez" || p.HTTPGet.Port.IntVal != ports["healthz"] {
		t.Errorf("liveness probe %+v, want /livez on the healthz port", p)
	}
}

// readKubeProxyConfiguration decodes a config.conf strictly into
// kube-proxy's own type and checks what the manifest relies on.
func readKubeProxyConfiguration(t *testing.T, data string) *kubeproxyconfig.KubeProxyConfiguration {
	t.Helper()
	var kp kubeproxyconfig.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict([]byte(data), &kp); err != nil {
		t.Fatalf("config.conf: %v", err)
	}
	if kp.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" || kp.Kind != "KubeProxyConfiguration" {
		t.Errorf("config.conf is a %s %s", kp.APIVersion, kp.Kind)
	}
	if kp.Mode != "nftables" {
		t.Errorf("mode %q, want nftables", kp.Mode)
	}
	if kp.ClusterCIDR == "" {
		t.Error("no clusterCIDR")
	}
	for _, c := range strings.Split(kp.ClusterCIDR, ",") {
		if _, err := netip.ParsePrefix(strings.TrimSpace(c)); err != nil {
			t.Errorf("clusterCIDR: %v", err)
		}
	}
	if kp.ClientConnection.Kubeconfig != "" {
		t.Errorf("clientConnection.kubeconfig %q: the pod has no such file", kp.ClientConnection.Kubeconfig)
	}
	return &kp
}
