package changetracker

import (
	"bytes"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/model"
)

func TestServiceConversion(t *testing.T) {
	var (
		tcp   = spn("a", "", model.TCP)
		named = func(port string, proto model.Protocol) model.ServicePortName { return spn("a", port, proto) }
		v6IP  = func(p *model.ServicePort) { p.ClusterIP = netip.MustParseAddr("fd00::1") }
		vip   = ptr(v1.LoadBalancerIPModeVIP)
		proxy = ptr(v1.LoadBalancerIPModeProxy)
	)
	type want = map[model.ServicePortName]*model.ServicePort
	tests := []struct {
		name      string
		family    model.IPFamily // default IPv4
		proxyName string
		svc       *v1.Service
		want      want
	}{{
		name: "cluster IP, protocol defaults to TCP",
		svc:  svc("a", ports(v1.ServicePort{Port: 80})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "several named ports",
		svc: svc("a", ports(
			v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP},
			v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
			v1.ServicePort{Name: "sig", Port: 3868, Protocol: v1.ProtocolSCTP},
		)),
		want: want{
			named("http", model.TCP): sp(named("http", model.TCP), 80),
			named("dns", model.UDP):  sp(named("dns", model.UDP), 53),
			named("sig", model.SCTP): sp(named("sig", model.SCTP), 3868),
		},
	}, {
		name: "dual stack, IPv4 tracker",
		svc:  svc("a", clusterIPs("10.0.0.1", "fd00::1")),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name:   "dual stack, IPv6 tracker",
		family: model.IPv6,
		svc:    svc("a", clusterIPs("10.0.0.1", "fd00::1")),
		want:   want{tcp: sp(tcp, 80, v6IP)},
	}, {
		name: "IPv6 single stack in the IPv4 tracker",
		svc:  svc("a", clusterIPs("fd00::1")),
		want: want{},
	}, {
		name: "legacy spec.clusterIP only",
		svc:  svc("a", func(s *v1.Service) { s.Spec.ClusterIPs = nil }),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "legacy IPv4 with leading zeros",
		svc:  svc("a", clusterIPs("010.000.000.001")),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.ClusterIP = netip.MustParseAddr("10.0.0.1") })},
	}, {
		name: "IPv4-mapped cluster IP counts as IPv4",
		svc:  svc("a", clusterIPs("::ffff:10.0.0.1")),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "no cluster IP yet",
		svc:  svc("a", clusterIPs()),
		want: want{},
	}, {
		name: "headless",
		svc:  svc("a", clusterIPs("None")),
		want: want{},
	}, {
		name: "headless label",
		svc:  svc("a", labels(v1.IsHeadlessService, "")),
		want: want{},
	}, {
		name: "ExternalName",
		svc:  svc("a", svcType(v1.ServiceTypeExternalName), clusterIPs()),
		want: want{},
	}, {
		name: "ExternalName with a stale cluster IP",
		svc:  svc("a", svcType(v1.ServiceTypeExternalName)),
		want: want{},
	}, {
		name: "other proxy's service",
		svc:  svc("a", labels(LabelServiceProxyName, "other")),
		want: want{},
	}, {
		name:      "our proxy's service",
		proxyName: "mine",
		svc:       svc("a", labels(LabelServiceProxyName, "mine")),
		want:      want{tcp: sp(tcp, 80)},
	}, {
		name:      "unlabelled service with a proxy name configured",
		proxyName: "mine",
		svc:       svc("a"),
		want:      want{},
	}, {
		name:      "other proxy's service with a proxy name configured",
		proxyName: "mine",
		svc:       svc("a", labels(LabelServiceProxyName, "other")),
		want:      want{},
	}, {
		name: "ClusterIP type ignores node ports, external policy and load-balancer status",
		svc: svc("a",
			ports(v1.ServicePort{Port: 80, NodePort: 30080}),
			with(func(s *v1.ServiceSpec) {
				s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.HealthCheckNodePort = 30000
				s.LoadBalancerSourceRanges = []string{"1.2.3.0/24"}
			}),
			lbIngress(v1.LoadBalancerIngress{IP: "5.6.7.8"})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "external IPs: family filter, invalid and duplicate dropped",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.ExternalIPs = []string{"192.0.2.1", "2001:db8::1", "bogus", "192.0.2.1", "192.0.2.2"}
		})),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.ExternalIPs = addrs("192.0.2.1", "192.0.2.2") })},
	}, {
		name:   "external IPs, IPv6 tracker",
		family: model.IPv6,
		svc: svc("a", clusterIPs("fd00::1"), with(func(s *v1.ServiceSpec) {
			s.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
		})),
		want: want{tcp: sp(tcp, 80, v6IP, func(p *model.ServicePort) { p.ExternalIPs = addrs("2001:db8::1") })},
	}, {
		name: "NodePort with external policy Local",
		svc: svc("a", svcType(v1.ServiceTypeNodePort),
			ports(v1.ServicePort{Port: 80, NodePort: 30080}),
			with(func(s *v1.ServiceSpec) {
				s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.HealthCheckNodePort = 30000 // only for LoadBalancer
			}),
			lbIngress(v1.LoadBalancerIngress{IP: "5.6.7.8"})),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) {
			p.NodePort = 30080
			p.ExternalPolicy = model.PolicyLocal
		})},
	}, {
		name: "NodePort out of range is dropped, the port kept",
		svc: svc("a", svcType(v1.ServiceTypeNodePort),
			ports(v1.ServicePort{Port: 80, NodePort: 70000})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "LoadBalancer",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer),
			ports(v1.ServicePort{Port: 80, NodePort: 30080}),
			with(func(s *v1.ServiceSpec) {
				s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.HealthCheckNodePort = 30000
				s.LoadBalancerSourceRanges = []string{" 1.2.3.4/24 ", "2001:db8::/32", "nope", "10.0.0.0/8"}
			}),
			lbIngress(
				v1.LoadBalancerIngress{IP: "5.6.7.8"},
				v1.LoadBalancerIngress{IP: "5.6.7.9", IPMode: vip},
				v1.LoadBalancerIngress{IP: "5.6.7.10", IPMode: proxy},
				v1.LoadBalancerIngress{Hostname: "lb.example.com"},
				v1.LoadBalancerIngress{IP: "2001:db8::5"},
				v1.LoadBalancerIngress{IP: "not-an-ip"},
				v1.LoadBalancerIngress{IP: "5.6.7.11", IPMode: ptr(v1.LoadBalancerIPMode("Weird"))},
			)),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) {
			p.NodePort = 30080
			p.ExternalPolicy = model.PolicyLocal
			p.HealthCheckNodePort = 30000
			p.LoadBalancerIPs = addrs("5.6.7.8", "5.6.7.9")
			p.LoadBalancerSourceRanges = prefixes("1.2.3.0/24", "10.0.0.0/8")
		})},
	}, {
		name: "LoadBalancer, external policy Cluster has no health check port",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer),
			with(func(s *v1.ServiceSpec) { s.HealthCheckNodePort = 30000 })),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "LoadBalancer, health check port out of range",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer),
			with(func(s *v1.ServiceSpec) {
				s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.HealthCheckNodePort = -1
			})),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.ExternalPolicy = model.PolicyLocal })},
	}, {
		name: "source ranges from the annotation when the field is empty",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
			s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "1.2.3.0/24, 2001:db8::/32,,bad, 4.5.6.0/24"}
		}),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) {
			p.LoadBalancerSourceRanges = prefixes("1.2.3.0/24", "4.5.6.0/24")
		})},
	}, {
		name:   "source ranges from the annotation, IPv6 tracker",
		family: model.IPv6,
		svc: svc("a", clusterIPs("fd00::1"), svcType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
			s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "1.2.3.0/24,2001:db8::/32"}
		}),
		want: want{tcp: sp(tcp, 80, v6IP, func(p *model.ServicePort) {
			p.LoadBalancerSourceRanges = prefixes("2001:db8::/32")
		})},
	}, {
		name: "the field wins over the annotation",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer), func(s *v1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"9.9.9.0/24"}
			s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "1.2.3.0/24"}
		}),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) {
			p.LoadBalancerSourceRanges = prefixes("9.9.9.0/24")
		})},
	}, {
		name: "scheduler annotation, trimmed and lower-cased",
		svc: svc("a", func(s *v1.Service) {
			s.Annotations = map[string]string{AnnotationScheduler: " SH "}
		}),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.Scheduler = "sh" })},
	}, {
		name: "forwarding mode annotation, trimmed and lower-cased",
		svc: svc("a", func(s *v1.Service) {
			s.Annotations = map[string]string{AnnotationForwardingMode: " DSR"}
		}),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.ForwardingMode = "dsr" })},
	}, {
		name: "session affinity without config uses the default timeout",
		svc:  svc("a", with(func(s *v1.ServiceSpec) { s.SessionAffinity = v1.ServiceAffinityClientIP })),
		want: want{tcp: sp(tcp, 80, affinity(10800*time.Second))},
	}, {
		name: "session affinity with a timeout",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.SessionAffinity = v1.ServiceAffinityClientIP
			s.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
		})),
		want: want{tcp: sp(tcp, 80, affinity(time.Minute))},
	}, {
		name: "session affinity with an invalid timeout uses the default",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.SessionAffinity = v1.ServiceAffinityClientIP
			s.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(0))}}
		})),
		want: want{tcp: sp(tcp, 80, affinity(10800*time.Second))},
	}, {
		name: "session affinity None ignores its config",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.SessionAffinity = v1.ServiceAffinityNone
			s.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
		})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "internal traffic policy Local",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		})),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.InternalPolicy = model.PolicyLocal })},
	}, {
		name: "internal traffic policy Cluster",
		svc: svc("a", with(func(s *v1.ServiceSpec) {
			s.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyCluster)
		})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "trafficDistribution PreferClose",
		svc:  svc("a", with(func(s *v1.ServiceSpec) { s.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose) })),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.TrafficDistribution = model.PreferSameZone })},
	}, {
		name: "trafficDistribution PreferSameZone",
		svc:  svc("a", with(func(s *v1.ServiceSpec) { s.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameZone) })),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.TrafficDistribution = model.PreferSameZone })},
	}, {
		name: "trafficDistribution PreferSameNode",
		svc:  svc("a", with(func(s *v1.ServiceSpec) { s.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameNode) })),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) { p.TrafficDistribution = model.PreferSameNode })},
	}, {
		name: "unknown trafficDistribution ignored",
		svc:  svc("a", with(func(s *v1.ServiceSpec) { s.TrafficDistribution = ptr("PreferMars") })),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "loopback cluster IP skips the service",
		svc:  svc("a", clusterIPs("127.0.0.1")),
		want: want{},
	}, {
		name:   "IPv6 loopback cluster IP skips the service",
		family: model.IPv6,
		svc:    svc("a", clusterIPs("::1")),
		want:   want{},
	}, {
		name: "multicast cluster IP skips the service",
		svc:  svc("a", clusterIPs("224.0.0.251")),
		want: want{},
	}, {
		name: "link-local cluster IP skips the service",
		svc:  svc("a", clusterIPs("169.254.169.254")),
		want: want{},
	}, {
		name: "loopback, multicast and link-local external and load-balancer IPs dropped",
		svc: svc("a", svcType(v1.ServiceTypeLoadBalancer), ports(v1.ServicePort{Port: 80, NodePort: 30080}), with(func(s *v1.ServiceSpec) {
			s.ExternalIPs = []string{"127.0.0.53", "192.0.2.1", "239.0.0.1", "169.254.1.1"}
		}), lbIngress(v1.LoadBalancerIngress{IP: "127.0.0.1"}, v1.LoadBalancerIngress{IP: "255.255.255.255"}, v1.LoadBalancerIngress{IP: "203.0.113.7"})),
		want: want{tcp: sp(tcp, 80, func(p *model.ServicePort) {
			p.NodePort = 30080
			p.ExternalIPs = addrs("192.0.2.1")
			p.LoadBalancerIPs = addrs("203.0.113.7")
		})},
	}, {
		name: "invalid cluster IP of this family skips the service",
		svc:  svc("a", clusterIPs("10.0.0.300")),
		want: want{},
	}, {
		name: "invalid cluster IP of the other family, by declared family",
		svc: svc("a", clusterIPs("10.0.0.1", "garbage"), with(func(s *v1.ServiceSpec) {
			s.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		})),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name:   "invalid cluster IP of this family, by declared family",
		family: model.IPv6,
		svc: svc("a", clusterIPs("10.0.0.1", "garbage"), with(func(s *v1.ServiceSpec) {
			s.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		})),
		want: want{},
	}, {
		name:   "invalid cluster IP of the other family, by its colon",
		family: model.IPv6,
		svc:    svc("a", clusterIPs("10.0.0.x", "fd00::1")),
		want:   want{tcp: sp(tcp, 80, v6IP)},
	}, {
		name: "zoned cluster IP is invalid",
		svc:  svc("a", clusterIPs("10.0.0.1", "fe80::1%eth0")),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name: "two cluster IPs of one family: the first wins",
		svc:  svc("a", clusterIPs("10.0.0.1", "10.0.0.2")),
		want: want{tcp: sp(tcp, 80)},
	}, {
		name:   "two cluster IPs of one family, the other tracker",
		family: model.IPv6,
		svc:    svc("a", clusterIPs("10.0.0.1", "10.0.0.2")),
		want:   want{},
	}, {
		name: "bad ports are dropped, the rest kept",
		svc: svc("a", ports(
			v1.ServicePort{Name: "zero", Port: 0},
			v1.ServicePort{Name: "big", Port: 70000},
			v1.ServicePort{Name: "neg", Port: -1},
			v1.ServicePort{Name: "icmp", Port: 1, Protocol: "ICMP"},
			v1.ServicePort{Name: "ok", Port: 65535},
		)),
		want: want{named("ok", model.TCP): sp(named("ok", model.TCP), 65535)},
	}, {
		name: "duplicate port name and protocol: the first wins",
		svc: svc("a", ports(
			v1.ServicePort{Name: "p", Port: 80},
			v1.ServicePort{Name: "p", Port: 81, Protocol: v1.ProtocolTCP},
			v1.ServicePort{Name: "p", Port: 82, Protocol: v1.ProtocolUDP},
		)),
		want: want{
			named("p", model.TCP): sp(named("p", model.TCP), 80),
			named("p", model.UDP): sp(named("p", model.UDP), 82),
		},
	}, {
		name: "no valid port",
		svc:  svc("a", ports(v1.ServicePort{Port: 0})),
		want: want{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := tt.family
			if fam == 0 {
				fam = model.IPv4
			}
			tr := New(Config{Family: fam, ServiceProxyName: tt.proxyName, Logger: testLogger(t)})
			tr.OnService(nil, tt.svc)
			res := tr.Apply()
			if diff := cmp.Diff(tt.want, tr.State().Services, cmpOpts); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
			wantChanged := changed()
			for n := range tt.want {
				wantChanged[n] = struct{}{}
			}
			if diff := cmp.Diff(wantChanged, res.Changed); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			if tr.Pending() {
				t.Error("pending after Apply")
			}
		})
	}
}

// TestServicePortEqualCoversAllFields guards servicePortEqual against
// fields added to model.ServicePort later.
func TestServicePortEqualCoversAllFields(t *testing.T) {
	base := sp(spn("a", "", model.TCP), 80)
	typ := reflect.TypeOf(*base)
	for i := range typ.NumField() {
		mod := *base
		f := reflect.ValueOf(&mod).Elem().Field(i)
		switch v := f.Addr().Interface().(type) {
		case *model.ServicePortName:
			v.Port = "other"
		case *netip.Addr:
			*v = netip.MustParseAddr("10.9.9.9")
		case *uint16:
			*v++
		case *model.Protocol:
			*v = model.UDP
		case *[]netip.Addr:
			*v = addrs("10.9.9.9")
		case *[]netip.Prefix:
			*v = prefixes("10.9.0.0/16")
		case *bool:
			*v = !*v
		case *time.Duration:
			*v++
		case *model.TrafficPolicy:
			*v = "Other"
		case *model.TrafficDistribution:
			*v = "Other"
		case *string:
			*v += "other"
		default:
			t.Fatalf("field %s: type %s not handled by this test", typ.Field(i).Name, f.Type())
		}
		if servicePortEqual(base, &mod) {
			t.Errorf("servicePortEqual ignores field %s", typ.Field(i).Name)
		}
	}
}

// TestServiceConflictsLogged checks that fields the API keeps consistent
// but a hand-written object may not are settled with a log line.
func TestServiceConflictsLogged(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		svc        *v1.Service
	}{
		{"clusterIP against clusterIPs", "clusterIP differs from clusterIPs[0]",
			svc("a", func(s *v1.Service) { s.Spec.ClusterIP = "10.0.0.9" })},
		{"ipFamilies against the address", "ipFamilies disagrees",
			svc("a", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} })},
	} {
		var buf bytes.Buffer
		tr := New(Config{Family: model.IPv4, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		tr.OnService(nil, tc.svc)
		tr.Apply()
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%s: log %q lacks %q", tc.name, buf.String(), tc.want)
		}
		if len(tr.State().Services) != 1 {
			t.Errorf("%s: %d service ports, want the service kept", tc.name, len(tr.State().Services))
		}
	}
}
