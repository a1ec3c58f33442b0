// Command controller shows a custom controller that proxies only the
// Services it chooses: those matching a label selector
// (proxykit.example/expose=true by default). It reads Services and
// EndpointSlices with the static source, filters the Services before they
// reach the Proxier, and programs them into a network namespace of its own.
//
//	sudo go run ./examples/controller [--services FILE] [--selector LABELS]
//
// It builds a sandbox (package sandbox) for that namespace and its pods,
// probes every Service of the file and checks that exactly the selected ones
// answer; it exits non-zero if not. See README.md.
package main
