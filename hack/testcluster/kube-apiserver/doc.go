// Command kube-apiserver is the upstream Kubernetes API server, built from the
// pinned k8s.io/kubernetes module for proxykit's end-to-end tests. It lives in
// its own module so that the main module never depends on k8s.io/kubernetes;
// hack/testcluster/build.sh builds it into a cache directory outside the repo.
package main
