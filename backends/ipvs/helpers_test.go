package ipvs

import (
	"net/netip"
	"time"

	"github.com/proxykit/proxykit/internal/backendtest"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// svc is a service port with its targets.
type svc = backendtest.Svc

// Short names for the builders the tests use most.
var (
	eps        = backendtest.Endpoints
	clusterSvc = backendtest.ClusterSvc
)

// request builds a sync request of family f holding svcs, incremental
// with the changed service ports when given, Full otherwise.
func request(f model.IPFamily, svcs []svc, changed ...model.ServicePortName) *proxier.SyncRequest {
	return backendtest.Request(f, svcs, changed)
}

func testRenderer(f model.IPFamily, nodeAddrs ...string) *renderer {
	r := &renderer{fam: f, scheduler: "rr", affinityTO: model.DefaultAffinityTimeout}
	for _, a := range nodeAddrs {
		r.nodeAddrs = append(r.nodeAddrs, netip.MustParseAddr(a))
	}
	return r
}

var _ = time.Second
