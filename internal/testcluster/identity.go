package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// WriteKubeconfig writes a kubeconfig file at path for the API server with
// the given user name and bearer token, the CA embedded, and returns
// path.
func (c *Cluster) WriteKubeconfig(path, user, token string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testcluster"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.pki.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testcluster"] = &clientcmdapi.Context{Cluster: "testcluster", AuthInfo: user}
	cfg.CurrentContext = "testcluster"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", err
	}
	return path, nil
}

// ServiceAccountKubeconfig creates the ServiceAccount namespace/name (and
// its namespace) unless they exist, requests a bound token for it (valid
// 24 h) through the TokenRequest API, and writes a kubeconfig holding that
// token into the cluster's directory. A program using it has the rights
// RBAC grants the service account, as a pod running as it would.
func (c *Cluster) ServiceAccountKubeconfig(tb testing.TB, namespace, name string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token, err := c.serviceAccountToken(ctx, c.Client(tb), namespace, name)
	if err != nil {
		tb.Fatalf("testcluster: service account %s/%s: %v", namespace, name, err)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	path, err := c.WriteKubeconfig(filepath.Join(c.Dir, namespace+"-"+name+".kubeconfig"), user, token)
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

func (c *Cluster) serviceAccountToken(ctx context.Context, cs kubernetes.Interface, namespace, name string) (string, error) {
	if err := ensureNamespace(ctx, cs, namespace); err != nil {
		return "", err
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(24 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token request: %w", err)
	}
	return tr.Status.Token, nil
}

// ensureNamespace creates a namespace unless it exists. The API server
// creates kube-system, default and kube-public itself, shortly after it
// is ready; creating one first is harmless.
func ensureNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}

// ApplyRBAC creates (or replaces) the ServiceAccounts, ClusterRoles,
// ClusterRoleBindings, Roles and RoleBindings of a multi-document YAML
// manifest, such as a DaemonSet's deploy file, and creates the namespaces
// they live in. Other kinds are skipped: no controller runs to act on
// them. It returns "Kind namespace/name" of what it applied. Documents are
// decoded strictly: an unknown field is an error.
func ApplyRBAC(ctx context.Context, cs kubernetes.Interface, manifest string) ([]string, error) {
	f, err := os.Open(manifest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var applied []string
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return applied, nil
		}
		if err != nil {
			return applied, fmt.Errorf("%s: %w", manifest, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return applied, fmt.Errorf("%s: %w", manifest, err)
		}
		what, err := applyDoc(ctx, cs, tm, doc)
		if err != nil {
			return applied, fmt.Errorf("%s: %s: %w", manifest, tm.Kind, err)
		}
		if what != "" {
			applied = append(applied, what)
		}
	}
}

func applyDoc(ctx context.Context, cs kubernetes.Interface, tm metav1.TypeMeta, doc []byte) (string, error) {
	switch {
	case tm.APIVersion == "v1" && tm.Kind == "ServiceAccount":
		var o v1.ServiceAccount
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return "", err
		}
		if err := ensureNamespace(ctx, cs, o.Namespace); err != nil {
			return "", err
		}
		c := cs.CoreV1().ServiceAccounts(o.Namespace)
		return applied(tm, &o.ObjectMeta, apply(ctx, &o, c.Create, c.Get, c.Update))
	case tm.APIVersion == rbacv1.SchemeGroupVersion.String() && tm.Kind == "ClusterRole":
		var o rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return "", err
		}
		c := cs.RbacV1().ClusterRoles()
		return applied(tm, &o.ObjectMeta, apply(ctx, &o, c.Create, c.Get, c.Update))
	case tm.APIVersion == rbacv1.SchemeGroupVersion.String() && tm.Kind == "ClusterRoleBinding":
		var o rbacv1.ClusterRoleBinding
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return "", err
		}
		c := cs.RbacV1().ClusterRoleBindings()
		return applied(tm, &o.ObjectMeta, apply(ctx, &o, c.Create, c.Get, c.Update))
	case tm.APIVersion == rbacv1.SchemeGroupVersion.String() && tm.Kind == "Role":
		var o rbacv1.Role
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return "", err
		}
		if err := ensureNamespace(ctx, cs, o.Namespace); err != nil {
			return "", err
		}
		c := cs.RbacV1().Roles(o.Namespace)
		return applied(tm, &o.ObjectMeta, apply(ctx, &o, c.Create, c.Get, c.Update))
	case tm.APIVersion == rbacv1.SchemeGroupVersion.String() && tm.Kind == "RoleBinding":
		var o rbacv1.RoleBinding
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return "", err
		}
		if err := ensureNamespace(ctx, cs, o.Namespace); err != nil {
			return "", err
		}
		c := cs.RbacV1().RoleBindings(o.Namespace)
		return applied(tm, &o.ObjectMeta, apply(ctx, &o, c.Create, c.Get, c.Update))
	}
	return "", nil
}

// object is what apply needs of a typed object.
type object interface {
	GetName() string
	GetResourceVersion() string
	SetResourceVersion(string)
}

// apply creates o, or replaces the existing object of its name.
func apply[T object](ctx context.Context, o T,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
) error {
	_, err := create(ctx, o, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	o.SetResourceVersion(cur.GetResourceVersion())
	_, err = update(ctx, o, metav1.UpdateOptions{})
	return err
}

func applied(tm metav1.TypeMeta, m *metav1.ObjectMeta, err error) (string, error) {
	if err != nil {
		return "", err
	}
	if m.Namespace == "" {
		return tm.Kind + " " + m.Name, nil
	}
	return tm.Kind + " " + m.Namespace + "/" + m.Name, nil
}

// ManifestKubeconfig applies the RBAC of manifest ([ApplyRBAC], as admin)
// and returns a kubeconfig holding a token of the one ServiceAccount it
// defines ([Cluster.ServiceAccountKubeconfig]): a program under test then
// runs with the rights the manifest grants it. It fails the test if the
// manifest cannot be applied or defines no ServiceAccount.
func (c *Cluster) ManifestKubeconfig(tb testing.TB, manifest string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	applied, err := ApplyRBAC(ctx, c.Client(tb), manifest)
	if err != nil {
		tb.Fatalf("testcluster: %v", err)
	}
	var sa []string
	for _, a := range applied {
		if s, ok := strings.CutPrefix(a, "ServiceAccount "); ok {
			sa = strings.Split(s, "/")
		}
	}
	if len(sa) != 2 {
		tb.Fatalf("testcluster: %s: no ServiceAccount among %q", manifest, applied)
	}
	return c.ServiceAccountKubeconfig(tb, sa[0], sa[1])
}
