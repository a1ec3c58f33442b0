package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/backends"
)

// kubeProxyVersion is the kube-proxy release whose configuration, flags
// and endpoints this daemon follows.
const kubeProxyVersion = "v1.36.3"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := command(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	if err != nil && !errors.Is(err, errHelp) {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
}

// clientFunc builds the API client from the resolved settings; tests
// give a fake one.
type clientFunc func(s *settings) (kubernetes.Interface, error)

// command runs the daemon's command line as kube-proxy's RunE does:
// --version prints and exits; the configuration is resolved and
// validated; --write-config-to writes it and exits; --cleanup removes
// what every backend left and exits; otherwise the daemon runs (and with
// --init-only stops after the node setup). With --config, a change of
// the file's content ends the run with an error, as kube-proxy exits for
// its supervisor to restart it with the new file.
func command(ctx context.Context, args []string, stdout, stderr io.Writer, client clientFunc) error {
	if len(args) > 0 && args[0] == "inspect" {
		return runInspect(ctx, args[1:], stdout, stderr)
	}
	s, err := resolve(args, stderr)
	if err != nil {
		return err
	}
	switch s.version {
	case "true":
		fmt.Fprintf(stdout, "proxykit-proxy %s (kube-proxy %s)\n", moduleVersion(), kubeProxyVersion)
		return nil
	case "raw":
		fmt.Fprintf(stdout, "proxykit-proxy %s\nkube-proxy: %s\ngo: %s\nplatform: %s/%s\n", moduleVersion(), kubeProxyVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	}
	log := s.log
	if s.writeConfigTo != "" {
		if err := writeConfig(s.writeConfigTo, &s.cfg); err != nil {
			return err
		}
		log.Info("Wrote configuration", "file", s.writeConfigTo)
		return nil
	}
	if s.cleanup {
		if err := backends.CleanupAll(ctx, s.cleanupConfig(), ""); err != nil {
			return fmt.Errorf("encountered an error while tearing down rules: %w", err)
		}
		log.Info("cleaned up", "backends", backends.Names())
		return nil
	}

	nodeName, err := hostname(s.cfg.HostnameOverride)
	if err != nil {
		return err
	}
	if client == nil {
		client = func(s *settings) (kubernetes.Interface, error) {
			cfg, err := restConfig(s.cfg.ClientConnection, s.master, s.log)
			if err != nil {
				return nil, err
			}
			return newClient(cfg)
		}
	}
	c, err := client(s)
	if err != nil {
		return err
	}
	if !s.initOnly {
		applyOOMScoreAdj(*s.cfg.OOMScoreAdj, log)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if s.configFile != "" && !s.initOnly {
		go watchConfigFile(ctx, s.configFile, cancel, log)
	}
	d := &daemon{s: s, client: c, nodeName: nodeName, stdout: stdout}
	err = d.run(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, errConfigChanged) {
		err = errors.Join(err, cause)
	}
	return err
}

// hostname is the node name as kube-proxy's GetHostname: the override,
// else the host name, trimmed and lowercased.
func hostname(override string) (string, error) {
	h := override
	if h == "" {
		var err error
		if h, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("couldn't determine hostname: %w", err)
		}
	}
	h = strings.ToLower(strings.TrimSpace(h))
	if h == "" {
		return "", errors.New("empty hostname is invalid")
	}
	return h, nil
}

// errConfigChanged ends a run whose --config file changed.
var errConfigChanged = errors.New("content of the proxy server's configuration file was updated")

// configPoll is how often the --config file is read for changes.
var configPoll = 2 * time.Second

// watchConfigFile cancels ctx with errConfigChanged when the content of
// path changes (kube-proxy watches it with fsnotify; reading it also
// follows the symlink swaps of a ConfigMap volume).
func watchConfigFile(ctx context.Context, path string, cancel context.CancelCauseFunc, log *slog.Logger) {
	old, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(configPoll):
		}
		b, err := os.ReadFile(path)
		if err == nil && !bytes.Equal(b, old) {
			log.Error("the configuration file changed; exiting, for a restart to read it", "file", path)
			cancel(errConfigChanged)
			return
		}
	}
}

// applyOOMScoreAdj sets the process's oom_score_adj, as kube-proxy does
// at start; a failure is logged at V(2), as kube-proxy does.
func applyOOMScoreAdj(v int32, log *slog.Logger) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0o644); err != nil {
		log.Log(context.Background(), slog.Level(-2), "Failed to apply OOMScore", "err", err)
	}
}

// moduleVersion is the proxykit module's version in the build info.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/proxykit/proxykit" {
			return d.Version
		}
	}
	return bi.Main.Version
}
