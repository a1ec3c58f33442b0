package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	// The API groups whose defaulting the API server applies to the
	// objects the oracle reads.
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/discovery/install"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
)

// decoder decodes the external (v1) types strictly: an unknown or duplicate
// field is an error, so a typo in a test's file does not pass unnoticed.
var decoder = serializer.NewCodecFactory(legacyscheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// loadFile reads the Services, EndpointSlices and ServiceCIDRs of a YAML (or
// JSON) file: several documents, and/or kind: List. Every object gets the
// API server's scheme defaults (port protocol TCP, session affinity None,
// traffic policies Cluster, ...) and, when namespaced and without one, the
// namespace "default". Objects of other kinds are skipped.
func loadFile(path string) ([]runtime.Object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for doc := 1; ; doc++ {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(stripComments(b))) == 0 {
			continue
		}
		if objs, err = decodeInto(objs, b); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
	}
}

func decodeInto(objs []runtime.Object, b []byte) ([]runtime.Object, error) {
	obj, gvk, err := decoder.Decode(b, nil, nil)
	if err != nil {
		return nil, err
	}
	switch x := obj.(type) {
	case *v1.List:
		for i, item := range x.Items {
			if objs, err = decodeInto(objs, item.Raw); err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
		}
		return objs, nil
	case *v1.Service:
		defaultNamespace(&x.ObjectMeta)
	case *discovery.EndpointSlice:
		defaultNamespace(&x.ObjectMeta)
	case *networkingv1.ServiceCIDR:
	default:
		klog.InfoS("Skipping an object of a kind kube-proxy does not watch", "kind", gvk)
		return objs, nil
	}
	legacyscheme.Scheme.Default(obj)
	return append(objs, obj), nil
}

func defaultNamespace(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = metav1.NamespaceDefault
	}
}

// stripComments drops YAML comment lines, to recognise a document that
// holds nothing else.
func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// semanticEqual reports whether two objects are equal as the API machinery
// compares them (quantities, times).
func semanticEqual(a, b any) bool { return equality.Semantic.DeepEqual(a, b) }

func durationPtr(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
