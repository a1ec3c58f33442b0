// Package healthcheck serves the health check node ports of Services.
//
// [ServiceServers] runs one HTTP server per Service with
// externalTrafficPolicy Local and a healthCheckNodePort. It answers 200 with
// the number of ready local endpoints while there are some and the proxier
// is healthy, and 503 otherwise, with the JSON body cloud load balancers
// expect, so they only send traffic to nodes that can serve it without an
// extra hop. Servers open and close as such Services come and go.
//
// Listeners are opened inside the network namespace the caller names, so
// health checks answer where the service traffic arrives.
package healthcheck
