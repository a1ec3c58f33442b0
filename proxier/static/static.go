package static

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/proxier"
)

// Objects is what a file holds.
type Objects struct {
	Services       []*v1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Nodes          []*v1.Node
}

// DocumentError is a document that could not be used.
type DocumentError struct {
	// Index is the document's position in the file, from 0.
	Index int
	// Err says why.
	Err error
}

func (e *DocumentError) Error() string { return fmt.Sprintf("document %d: %v", e.Index, e.Err) }

// Unwrap returns the underlying error.
func (e *DocumentError) Unwrap() error { return e.Err }

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
}

// Parse reads every YAML (or JSON) document of r. Documents of other kinds
// are ignored; a `kind: List` is unpacked. It returns the objects it could
// use and, joined, a [*DocumentError] for each document it could not; an
// I/O error is returned alone.
func Parse(r io.Reader) (*Objects, error) {
	objs := &Objects{}
	var errs []error
	rd := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for i := 0; ; i++ {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return objs, fmt.Errorf("read YAML: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := objs.add(doc); err != nil {
			errs = append(errs, &DocumentError{Index: i, Err: err})
		}
	}
	return objs, errors.Join(errs...)
}

func (o *Objects) add(doc []byte) error {
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	switch tm.Kind {
	case "":
		var v any
		if err := yaml.Unmarshal(doc, &v); err == nil && v == nil {
			return nil // empty or comment-only document
		}
		return errors.New("no kind")
	case "List", "ServiceList", "EndpointSliceList", "NodeList":
		var errs []error
		for _, item := range tm.Items {
			if err := o.add(item); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	case "Service":
		s := &v1.Service{}
		if err := yaml.UnmarshalStrict(doc, s); err != nil {
			return fmt.Errorf("Service: %w", err)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		o.Services = append(o.Services, s)
	case "EndpointSlice":
		s := &discoveryv1.EndpointSlice{}
		if err := yaml.UnmarshalStrict(doc, s); err != nil {
			return fmt.Errorf("EndpointSlice: %w", err)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		o.EndpointSlices = append(o.EndpointSlices, s)
	case "Node":
		n := &v1.Node{}
		if err := yaml.UnmarshalStrict(doc, n); err != nil {
			return fmt.Errorf("Node: %w", err)
		}
		o.Nodes = append(o.Nodes, n)
	}
	return nil
}

// Load parses the file at path; see [Parse].
func Load(path string) (*Objects, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	objs, err := Parse(f)
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return objs, err
}

// Source delivers the objects of a file to a Proxier.
type Source struct {
	// Path is the file to read.
	Path string
	// Watch is the interval at which the file is read again; zero means
	// the file is read once.
	Watch time.Duration
	// Logger receives parse errors; nil discards them.
	Logger *slog.Logger

	services map[string]*v1.Service
	slices   map[string]*discoveryv1.EndpointSlice
	nodes    map[string]*v1.Node
	last     []byte
}

// Run reads the file, delivers its objects to p, marks Services and
// EndpointSlices synced, and then, when watching, delivers every change
// until ctx is done. It returns the error of the first read only if the
// file cannot be read at all.
func (s *Source) Run(ctx context.Context, p proxier.Proxier) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.services = map[string]*v1.Service{}
	s.slices = map[string]*discoveryv1.EndpointSlice{}
	s.nodes = map[string]*v1.Node{}
	if err := s.reload(p, log); err != nil {
		return err
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnNodeSynced()
	if s.Watch <= 0 {
		return nil
	}
	t := time.NewTicker(s.Watch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.reload(p, log); err != nil {
				log.Warn("static source: cannot read file; keeping the last objects", "path", s.Path, "err", err)
			}
		}
	}
}

func (s *Source) reload(p proxier.Proxier, log *slog.Logger) error {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return err
	}
	if s.last != nil && bytes.Equal(data, s.last) {
		return nil
	}
	s.last = data
	objs, err := Parse(bytes.NewReader(data))
	if err != nil {
		log.Warn("static source: skipped documents", "path", s.Path, "err", err)
	}
	s.deliver(p, objs)
	return nil
}

// deliver hands p the difference between the objects delivered so far and
// objs, and remembers objs.
func (s *Source) deliver(p proxier.Proxier, objs *Objects) {
	key := func(ns, name string) string { return ns + "/" + name }
	diff(s.services, objs.Services, func(o *v1.Service) string { return key(o.Namespace, o.Name) },
		p.OnServiceAdd, p.OnServiceUpdate, p.OnServiceDelete)
	diff(s.slices, objs.EndpointSlices, func(o *discoveryv1.EndpointSlice) string { return key(o.Namespace, o.Name) },
		p.OnEndpointSliceAdd, p.OnEndpointSliceUpdate, p.OnEndpointSliceDelete)
	diff(s.nodes, objs.Nodes, func(o *v1.Node) string { return o.Name },
		p.OnNodeAdd, p.OnNodeUpdate, p.OnNodeDelete)
}

// diff calls add, update and delete for the difference between known (by
// key, updated in place) and objs.
func diff[T any](known map[string]T, objs []T, key func(T) string, add func(T), update func(old, cur T), del func(T)) {
	seen := make(map[string]bool, len(objs))
	for _, o := range objs {
		k := key(o)
		seen[k] = true
		switch old, ok := known[k]; {
		case !ok:
			add(o)
		case !equality.Semantic.DeepEqual(old, o):
			update(old, o)
		default:
			continue
		}
		known[k] = o
	}
	for k, old := range known {
		if !seen[k] {
			del(old)
			delete(known, k)
		}
	}
}
