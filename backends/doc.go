// Package backends names every dataplane backend of proxykit, so a program
// can choose one by name (a --backend flag) and remove what any of them left
// behind (a --cleanup flag, or switching backends).
//
// Importing this package links every backend and its dependencies; a
// program that needs one backend imports that backend's package instead.
package backends
