package main

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// gateSpec is one feature gate kube-proxy knows.
type gateSpec struct {
	name   string
	def    bool
	locked bool
	stage  string // ALPHA, BETA, GA or DEPRECATED
}

// gateLookup finds a gate by name.
func gateLookup(name string) (gateSpec, bool) {
	for _, g := range kubeProxyGates {
		if g.name == name {
			return g, true
		}
	}
	return gateSpec{}, false
}

// unsupportedGates are gates kube-proxy acts on whose non-default value
// no proxykit backend implements: setting one fails, naming it (when
// AllAlpha or AllBeta flips one, a warning says it has no effect).
var unsupportedGates = map[string]string{
	// kube-proxy leaves spec.externalIPs unprogrammed when it is off.
	"AllowServiceExternalIPs": "the backends always program spec.externalIPs",
	// kube-proxy then exposes native histograms.
	"NativeHistograms": "proxykit's metrics are classic Prometheus histograms",
}

// featureGates is the resolved set of gates: kube-proxy's defaults with
// the configuration's featureGates applied.
type featureGates struct {
	enabled map[string]bool
	set     map[string]bool // as given
}

// resolveGates applies m to kube-proxy's gates as component-base's
// SetFromMap does: an unknown name fails the whole set ("unrecognized
// feature gate: X"), a locked gate set against its default fails, GA and
// deprecated gates are set with a warning, AllAlpha and AllBeta set every
// alpha or beta gate not set on its own. Our own refusals follow:
// unsupportedGates.
func resolveGates(m map[string]bool, log *slog.Logger) (featureGates, error) {
	fg := featureGates{enabled: map[string]bool{}, set: maps.Clone(m)}
	for _, g := range kubeProxyGates {
		fg.enabled[g.name] = g.def
	}
	names := slices.Sorted(maps.Keys(m))
	for _, k := range names {
		if _, ok := gateLookup(k); !ok {
			return fg, fmt.Errorf("unrecognized feature gate: %s", k)
		}
	}
	var errs []string
	for _, k := range names {
		g, _ := gateLookup(k)
		v := m[k]
		if g.locked && g.def != v {
			errs = append(errs, fmt.Sprintf("cannot set feature gate %v to %v, feature is locked to %v", k, v, g.def))
			continue
		}
		switch k {
		case "AllAlpha", "AllBeta":
			stage := strings.ToUpper(strings.TrimPrefix(k, "All"))
			for _, o := range kubeProxyGates {
				if _, own := m[o.name]; !own && !o.locked && o.stage == stage && o.name != k {
					fg.enabled[o.name] = v
				}
			}
		}
		fg.enabled[k] = v
		switch g.stage {
		case "DEPRECATED":
			log.Warn("Warning: setting deprecated feature gate. It will be removed in a future release.", "featureGate", k, "value", v)
		case "GA":
			log.Warn("Warning: setting GA feature gate. It will be removed in a future release.", "featureGate", k, "value", v)
		}
	}
	if len(errs) > 0 {
		return fg, fmt.Errorf("%s", strings.Join(errs, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(unsupportedGates)) {
		g, _ := gateLookup(k)
		if v, set := m[k]; set && v != g.def {
			return fg, fmt.Errorf("feature gate %s=%v: not supported by proxykit (%s)", k, v, unsupportedGates[k])
		}
		if fg.enabled[k] != g.def {
			log.Warn("feature gate enabled by AllAlpha or AllBeta has no effect in proxykit", "featureGate", k, "why", unsupportedGates[k])
		}
	}
	return fg, nil
}

// String lists the gates set explicitly, as k=v,... sorted.
func (fg featureGates) String() string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(fg.set)) {
		s = append(s, k+"="+strconv.FormatBool(fg.set[k]))
	}
	return strings.Join(s, ",")
}

// collector returns kube-proxy's kubernetes_feature_enabled gauge: 1 for
// each enabled gate, 0 for each disabled one, labelled with its name and
// stage (empty for GA), as component-base's AddMetrics exports them.
func (fg featureGates) collector() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubernetes_feature_enabled",
		Help: "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
	}, []string{"name", "stage"})
	for _, s := range kubeProxyGates {
		stage := s.stage
		if stage == "GA" {
			stage = ""
		}
		v := 0.0
		if fg.enabled[s.name] {
			v = 1
		}
		g.WithLabelValues(s.name, stage).Set(v)
	}
	return g
}

// knownGateNames lists the gates for --feature-gates' help, as
// kube-proxy's help does (name=true|false (STAGE - default=D)).
func knownGateNames() []string {
	var s []string
	for _, g := range kubeProxyGates {
		if g.locked || g.stage == "GA" {
			continue
		}
		s = append(s, fmt.Sprintf("%s=true|false (%s - default=%v)", g.name, g.stage, g.def))
	}
	return s
}
