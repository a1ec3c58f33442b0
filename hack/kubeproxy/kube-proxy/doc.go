// Command kube-proxy is the upstream Kubernetes kube-proxy, built from the
// pinned k8s.io/kubernetes module for proxykit's side-by-side end-to-end test
// (e2e TestKubeProxySideBySide). main.go is upstream's cmd/kube-proxy/proxy.go
// unchanged. It lives in its own module so that the main module never
// depends on k8s.io/kubernetes; hack/kubeproxy/build.sh builds it into a
// cache directory outside the repository.
package main
