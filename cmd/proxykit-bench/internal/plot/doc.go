// Package plot draws the benchmark's charts as SVG with gonum.org/v1/plot:
// one line per dataplane over the number of services, on log scales.
package plot
