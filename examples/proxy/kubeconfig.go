package main

import (
	"errors"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	componentbaseconfig "k8s.io/component-base/config/v1alpha1"
)

// restConfig returns the API server configuration as kube-proxy's
// createClient does: with neither a kubeconfig file nor --master, the
// in-cluster one (a pod's service account); else the kubeconfig file's
// current context with --master, when set, as the server. Unlike
// kube-proxy, outside a cluster the first case falls back to $KUBECONFIG
// or ~/.kube/config, as kubectl finds it. The client connection's content
// types, QPS and burst are applied.
func restConfig(cc componentbaseconfig.ClientConnectionConfiguration, master string, log *slog.Logger) (*rest.Config, error) {
	var cfg *rest.Config
	if cc.Kubeconfig == "" && master == "" {
		log.Info("Neither kubeconfig file nor master URL was specified, falling back to in-cluster config")
		c, err := rest.InClusterConfig()
		switch {
		case err == nil:
			cfg = c
		case errors.Is(err, rest.ErrNotInCluster):
			if cfg, err = loadKubeconfig("", ""); err != nil {
				return nil, err
			}
		default:
			return nil, err
		}
	} else {
		c, err := loadKubeconfig(cc.Kubeconfig, master)
		if err != nil {
			return nil, err
		}
		cfg = c
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "proxykit-proxy"
	cfg.AcceptContentTypes = cc.AcceptContentTypes
	cfg.ContentType = cc.ContentType
	cfg.QPS = cc.QPS
	cfg.Burst = int(cc.Burst)
	return cfg, nil
}

// loadKubeconfig reads the current context of a kubeconfig file (empty
// path: $KUBECONFIG or ~/.kube/config) with client-go's loader; master,
// when set, overrides the server.
func loadKubeconfig(path, master string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules = &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	}
	overrides := &clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// newClient returns a clientset for cfg.
func newClient(cfg *rest.Config) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cfg)
}
