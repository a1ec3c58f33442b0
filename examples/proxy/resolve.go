package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// settings are the resolved command line: kube-proxy's configuration
// after flags, file and platform defaults, validated, and proxykit's own
// options.
type settings struct {
	cfg   proxyConfig
	ext   extOptions
	gates featureGates

	configFile    string
	writeConfigTo string
	cleanup       bool
	initOnly      bool
	version       string
	master        string

	log   *slog.Logger
	level *slog.LevelVar
	flags *pflag.FlagSet
}

// errHelp is returned for -h and --help, after the usage was printed.
var errHelp = pflag.ErrHelp

// resolve parses args and resolves the configuration as kube-proxy's
// Complete and Validate do: without --config, the flags bound to the
// configuration apply (the sync period flags of the mode, --cluster-cidr,
// the deprecated port flags); with --config, the file replaces them, and
// only the logging flags (-v, --logging-format, --log-flush-frequency),
// --hostname-override, --master and the process flags (--config,
// --write-config-to, --cleanup, --init-only, --version) still apply, as
// in kube-proxy. Unlike kube-proxy, which drops them silently, each flag
// so ignored is logged at warning. Then the platform defaults, the
// hostname override, the feature gates, kube-proxy's validation and our
// own refusals (what no backend implements) follow. Logs go to stderr.
func resolve(args []string, stderr io.Writer) (*settings, error) {
	o, fs, err := parseFlags(args, stderr)
	if err != nil {
		return nil, err
	}
	s := &settings{
		ext: o.ext, configFile: o.configFile, writeConfigTo: o.writeConfigTo,
		cleanup: o.cleanup, initOnly: o.initOnly, version: o.version, master: o.master,
		level: new(slog.LevelVar), flags: fs,
	}
	switch o.version {
	case "false", "":
	case "true", "raw":
		return s, nil
	default:
		return nil, fmt.Errorf("invalid value %q for --version: want true, false or raw", o.version)
	}
	// Until the configuration says how to log: text at the flags' level.
	s.level.Set(slog.Level(-int(o.verbosity)))
	s.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: s.level}))

	if o.configFile == "" && o.writeConfigTo == "" {
		o.cfg.HealthzBindAddress = addressFromDeprecatedFlags(o.cfg.HealthzBindAddress, o.healthzPort)
		o.cfg.MetricsBindAddress = addressFromDeprecatedFlags(o.cfg.MetricsBindAddress, o.metricsPort)
	}
	if o.configFile != "" {
		c, err := loadConfigFile(o.configFile, s.log)
		if err != nil {
			return nil, fmt.Errorf("failed complete: %w", err)
		}
		var ignored []string
		for _, name := range boundToConfig {
			if fs.Changed(name) {
				ignored = append(ignored, "--"+name)
			}
		}
		if fs.Changed("scheduler") && c.Mode == modeIPVS {
			ignored = append(ignored, "--scheduler")
		}
		if len(ignored) > 0 {
			s.log.Warn("flags ignored: --config is set, and kube-proxy takes these from the file", "flags", strings.Join(ignored, " "), "config", o.configFile)
		}
		o.cfg = c
	} else {
		// kube-proxy's processV1Alpha1Flags.
		if fs.Changed("iptables-sync-period") && o.cfg.Mode != modeIPVS {
			o.cfg.SyncPeriod.Duration = o.iptablesSyncPeriod
		}
		if fs.Changed("iptables-min-sync-period") && o.cfg.Mode != modeIPVS {
			o.cfg.MinSyncPeriod.Duration = o.iptablesMinSyncPeriod
		}
		if fs.Changed("ipvs-sync-period") && o.cfg.Mode == modeIPVS {
			o.cfg.SyncPeriod.Duration = o.ipvsSyncPeriod
		}
		if fs.Changed("ipvs-min-sync-period") && o.cfg.Mode == modeIPVS {
			o.cfg.MinSyncPeriod.Duration = o.ipvsMinSyncPeriod
		}
		if fs.Changed("cluster-cidr") {
			o.cfg.ClusterCIDRs = strings.Split(o.clusterCIDRs, ",")
		}
		if fs.Changed("scheduler") && o.cfg.Mode == modeIPVS {
			if fs.Changed("ipvs-scheduler") && o.cfg.IPVS.Scheduler != o.ext.scheduler {
				return nil, fmt.Errorf("--scheduler %q and --ipvs-scheduler %q disagree", o.ext.scheduler, o.cfg.IPVS.Scheduler)
			}
			o.cfg.IPVS.Scheduler = o.ext.scheduler
		}
	}
	// The logging flags win over the file (kube-proxy's copyLogsFromFlags).
	if fs.Changed("v") {
		o.cfg.Logging.Verbosity = logsapi.VerbosityLevel(o.verbosity)
	}
	if fs.Changed("logging-format") {
		o.cfg.Logging.Format = o.loggingFormat
	}
	if fs.Changed("log-flush-frequency") {
		o.cfg.Logging.FlushFrequency.Duration.Duration = o.logFlush
	}
	s.cfg = o.cfg
	c := &s.cfg

	// The configuration's logging.
	s.level.Set(slog.Level(-int(c.Logging.Verbosity)))
	if c.Logging.Format == "json" {
		s.log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: s.level}))
	}

	c.applyPlatformDefaults(s.log)
	if fs.Changed("hostname-override") {
		h := strings.TrimSpace(o.hostnameOverride)
		if h == "" {
			return nil, errors.New("failed complete: empty hostname-override is invalid")
		}
		c.HostnameOverride = strings.ToLower(h)
	}
	if s.gates, err = resolveGates(c.FeatureGates, s.log); err != nil {
		return nil, fmt.Errorf("failed complete: %w", err)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		s.log.Log(context.Background(), slog.Level(-1), fmt.Sprintf("FLAG: --%s=%q", f.Name, f.Value.String()))
	})
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("failed validate: %w", err)
	}
	if err := c.unsupported(s.log); err != nil {
		return nil, err
	}
	if err := checkScheduler(c, s.ext); err != nil {
		return nil, err
	}
	if len(s.gates.set) > 0 {
		s.log.Info("feature gates", "set", s.gates.String())
	}
	return s, nil
}

// addressFromDeprecatedFlags is kube-proxy's: port 0 disables the
// server, another port replaces the address's.
func addressFromDeprecatedFlags(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, port)
}
