package testcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options shape a control plane. The zero value is a dual-stack cluster
// with the defaults below.
type Options struct {
	// ServiceCIDRs are the service cluster IP ranges, primary first;
	// default DefaultServiceCIDRs.
	ServiceCIDRs []string
	// NodePortRange is the node port range; default 30000-32767.
	NodePortRange string
	// ExtraAPIServerArgs are appended to kube-apiserver's command line.
	ExtraAPIServerArgs []string
	// StartTimeout bounds the wait for each process to become ready;
	// default 60s.
	StartTimeout time.Duration
}

// DefaultServiceCIDRs are the service ranges of a cluster started with
// zero Options: IPv4 primary, and IPv6.
var DefaultServiceCIDRs = []string{"10.96.0.0/16", "fd00:10:96::/108"}

// Admin is the user name of the admin token (group system:masters).
const Admin = "proxykit-admin"

// Cluster is a running control plane.
type Cluster struct {
	// Dir holds the certificates, the token file, the kubeconfigs and
	// the processes' logs (etcd.log, kube-apiserver.log).
	Dir string
	// Host is the API server's URL, https://127.0.0.1:<port>.
	Host string
	// EtcdURL is etcd's client URL, http://127.0.0.1:<port>.
	EtcdURL string
	// AdminKubeconfig is a kubeconfig file for the admin token.
	AdminKubeconfig string
	// ServiceCIDRs are the service cluster IP ranges.
	ServiceCIDRs []string

	bins       Binaries
	pki        *pki
	adminToken string
	apiArgs    []string
	timeout    time.Duration

	mu          sync.Mutex
	etcd        *process
	etcdDataDir string // removed once etcd has stopped
	apiserver   *process
}

// Start starts etcd and kube-apiserver on loopback, waits until the API
// server is ready, and registers their teardown with tb.Cleanup. It skips
// the test when the binaries are missing ([RequireBinaries]) and fails it
// when the control plane does not come up. When the test fails, the end
// of both logs goes to the test log.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	bins := RequireBinaries(tb)
	start := time.Now()
	c, err := start1(tb, bins, opts)
	if errors.Is(err, errAddrInUse) {
		// Another process took a port we had found free: retry once
		// with fresh ports.
		c, err = start1(tb, bins, opts)
	}
	if err != nil {
		tb.Fatalf("testcluster: %v", err)
	}
	tb.Logf("testcluster: kube-apiserver %s and etcd ready at %s in %v (logs in %s)", KubernetesVersion, c.Host, time.Since(start).Round(time.Millisecond), c.Dir)
	return c
}

func start1(tb testing.TB, bins Binaries, opts Options) (*Cluster, error) {
	tb.Helper()
	if len(opts.ServiceCIDRs) == 0 {
		opts.ServiceCIDRs = DefaultServiceCIDRs
	}
	if opts.NodePortRange == "" {
		opts.NodePortRange = "30000-32767"
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	dir := tb.TempDir()
	p, err := newPKI(dir)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Dir:          dir,
		Host:         "https://127.0.0.1:" + strconv.Itoa(ports[2]),
		EtcdURL:      "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		ServiceCIDRs: opts.ServiceCIDRs,
		bins:         bins,
		pki:          p,
		adminToken:   randomToken(),
		timeout:      opts.StartTimeout,
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, f := range []string{"kube-apiserver.log", "etcd.log"} {
				tb.Logf("testcluster: end of %s:\n%s", f, tail(filepath.Join(dir, f), 30))
			}
		}
		killed, err := c.stop()
		if err != nil {
			tb.Errorf("testcluster: %v", err)
		}
		for _, k := range killed {
			tb.Logf("testcluster: %s did not stop within 10 s of SIGTERM; killed", k)
		}
	})

	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.adminToken+","+Admin+","+Admin+",\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}
	if c.AdminKubeconfig, err = c.WriteKubeconfig(filepath.Join(dir, "admin.kubeconfig"), Admin, c.adminToken); err != nil {
		return nil, err
	}

	if err := c.startEtcd(ports[0], ports[1]); err != nil {
		return nil, err
	}
	c.apiArgs = append([]string{
		"--etcd-servers=" + c.EtcdURL,
		"--etcd-prefix=/registry",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + dir,
		"--tls-cert-file=" + p.certFile,
		"--tls-private-key-file=" + p.keyFile,
		"--service-cluster-ip-range=" + strings.Join(opts.ServiceCIDRs, ","),
		"--service-node-port-range=" + opts.NodePortRange,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPubFile,
		"--service-account-signing-key-file=" + p.saKeyFile,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--anonymous-auth=false",
		// The "kubernetes" Service would get loopback endpoints, which
		// EndpointSlice validation refuses; nothing here needs them.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		// Close watches on SIGTERM instead of waiting up to a minute for
		// the clients to end them: StopAPIServer is then quick.
		"--shutdown-watch-termination-grace-period=2s",
	}, opts.ExtraAPIServerArgs...)
	if err := c.StartAPIServer(context.Background()); err != nil {
		return nil, err
	}
	return c, nil
}

// startEtcd starts a single-member etcd with its data in memory-backed
// storage when /dev/shm is writable (fsync is then free; stop removes
// it), and waits for its health endpoint.
func (c *Cluster) startEtcd(clientPort, peerPort int) error {
	dataDir, err := os.MkdirTemp("/dev/shm", "proxykit-etcd-")
	if err != nil {
		dataDir = filepath.Join(c.Dir, "etcd")
	}
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := startProcess("etcd", filepath.Join(c.Dir, "etcd.log"), c.bins.Etcd,
		"--name=default",
		"--data-dir="+dataDir,
		"--listen-client-urls="+c.EtcdURL,
		"--advertise-client-urls="+c.EtcdURL,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=default="+peer,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-level=warn",
	)
	if err != nil {
		os.RemoveAll(dataDir)
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.etcdDataDir = dataDir
	c.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	return c.waitReady(context.Background(), p, func() bool {
		resp, err := client.Get(c.EtcdURL + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// StartAPIServer starts kube-apiserver (again, after [Cluster.StopAPIServer])
// on the same address and waits until /readyz answers ok. It returns an
// error if the server is already running.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.apiserver != nil && !c.apiserver.exited() {
		c.mu.Unlock()
		return errors.New("kube-apiserver is running")
	}
	p, err := startProcess("kube-apiserver", filepath.Join(c.Dir, "kube-apiserver.log"), c.bins.KubeAPIServer, c.apiArgs...)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.apiserver = p
	c.mu.Unlock()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	return c.waitReady(ctx, p, func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Host+"/readyz", nil)
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitReady polls ready until it reports true, the process exits, ctx
// ends or the start timeout passes.
func (c *Cluster) waitReady(ctx context.Context, p *process, ready func() bool) error {
	deadline := time.Now().Add(c.timeout)
	for {
		if ready() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for %s: %w", p.name, err)
		}
		if p.exited() {
			err := p.exitError()
			if strings.Contains(tail(p.logPath, 40), "address already in use") {
				err = fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v; end of %s:\n%s", p.name, c.timeout, p.logPath, tail(p.logPath, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StopAPIServer stops kube-apiserver: SIGTERM, and SIGKILL if it has not
// exited 15 s later; etcd keeps running. Clients see connection refused
// until [Cluster.StartAPIServer]. It returns how long the stop took and
// whether SIGKILL was needed.
func (c *Cluster) StopAPIServer() (took time.Duration, killed bool, err error) {
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p == nil {
		return 0, false, nil
	}
	start := time.Now()
	killed, err = p.stop(15 * time.Second)
	return time.Since(start), killed, err
}

// stop stops kube-apiserver, then etcd, and returns the names of those it
// had to kill.
func (c *Cluster) stop() (killed []string, err error) {
	c.mu.Lock()
	api, etcd := c.apiserver, c.etcd
	c.mu.Unlock()
	var errs []error
	for _, p := range []*process{api, etcd} {
		if p == nil {
			continue
		}
		k, err := p.stop(10 * time.Second)
		errs = append(errs, err)
		if k {
			killed = append(killed, p.name)
		}
	}
	if etcd != nil && etcd.exited() {
		errs = append(errs, os.RemoveAll(c.etcdDataDir))
	}
	return killed, errors.Join(errs...)
}

// RESTConfig returns a client configuration for the admin token.
func (c *Cluster) RESTConfig() *rest.Config {
	return c.restConfig(c.adminToken)
}

func (c *Cluster) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            c.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.pki.caPEM...)},
		QPS:             -1, // no client-side rate limit: tests write in bursts
		UserAgent:       "proxykit-testcluster",
	}
}

// Client returns an admin clientset.
func (c *Cluster) Client(tb testing.TB) kubernetes.Interface {
	tb.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		tb.Fatal(err)
	}
	return cs
}

// APIServerPID returns the process ID of kube-apiserver while it runs,
// else 0: for a test that reads its CPU time or memory from /proc.
func (c *Cluster) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiserver.pid()
}

// EtcdPID returns the process ID of etcd while it runs, else 0.
func (c *Cluster) EtcdPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.etcd.pid()
}
