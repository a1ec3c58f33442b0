package proxier_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/proxykit/proxykit/proxier"
)

// reporter is a HealthReporter with a fixed answer; an Engine is the usual
// one.
type reporter proxier.Health

func (r reporter) Health() proxier.Health { return proxier.Health(r) }

// HealthHandler answers /healthz and /livez as kube-proxy does: 200 while
// the proxier keeps up with its events, 503 once an event has waited
// longer than the timeout.
func ExampleHealthHandler() {
	for _, h := range []proxier.Health{
		{LastSync: time.Now()}, // synced, nothing pending
		{LastSync: time.Now().Add(-time.Hour), OldestPending: time.Now().Add(-2 * time.Minute)}, // stuck
	} {
		srv := httptest.NewServer(proxier.HealthHandler(reporter(h), time.Minute))
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		srv.Close()
		fmt.Println(resp.StatusCode)
	}
	// Output:
	// 200
	// 503
}
