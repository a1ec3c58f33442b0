package static

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/proxier"
)

// Objects is what a file holds.
type Objects struct {
	Services       []*v1.Service                // the file's Services, in file order
	EndpointSlices []*discoveryv1.EndpointSlice // the file's EndpointSlices, in file order
	Nodes          []*v1.Node                   // the file's Nodes, in file order
	// ServiceCIDRs are the spec.cidrs of the file's ServiceCIDR objects,
	// masked, in file order, without repeats.
	ServiceCIDRs []netip.Prefix
	// Documents counts the documents that named a kind, of any kind (a
	// List, even an empty one, counts once). A file without any, such as
	// an empty or comment-only file, says nothing about what it would
	// replace.
	Documents int
}

// DocumentError is a document that could not be used.
type DocumentError struct {
	// Index is the document's position in the file, from 0.
	Index int
	// Kind and Name (namespace/name, or name) identify the document when
	// they could be read; either may be empty.
	Kind, Name string
	// Err says why.
	Err error
}

// Error names the document and says why it could not be used.
func (e *DocumentError) Error() string {
	what := fmt.Sprintf("document %d", e.Index)
	switch {
	case e.Kind != "" && e.Name != "":
		what += fmt.Sprintf(" (%s %s)", e.Kind, e.Name)
	case e.Kind != "":
		what += fmt.Sprintf(" (%s)", e.Kind)
	case e.Name != "":
		what += fmt.Sprintf(" (%s)", e.Name)
	}
	return what + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *DocumentError) Unwrap() error { return e.Err }

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
	Metadata   struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
}

// name is the document's namespace/name, or name, or "".
func (tm *typeMeta) name() string {
	if tm.Metadata.Namespace != "" && tm.Metadata.Name != "" {
		return tm.Metadata.Namespace + "/" + tm.Metadata.Name
	}
	return tm.Metadata.Name
}

// Parse reads every YAML (or JSON) document of r. Documents of other kinds
// are ignored; a `kind: List` is unpacked. It returns the objects it could
// use and, joined, a [*DocumentError] for each document it could not,
// naming it by position and, when readable, kind and name; an I/O error
// is returned alone, with the objects of the documents before it.
//
// Documents are decoded in parallel (up to GOMAXPROCS at a time): the
// YAML parser is what costs, about 0.1 ms per object. The result is the
// same as one at a time: objects and errors in file order.
func Parse(r io.Reader) (*Objects, error) {
	docs, readErr := readDocuments(r)
	parseAll(docs)
	objs, err := collect(docs)
	if readErr != nil {
		return objs, readErr
	}
	return objs, err
}

// readDocuments splits r into its non-empty documents; the error is
// r's, or the YAML reader's, after the documents before it.
func readDocuments(r io.Reader) ([]document, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []document
	for i := 0; ; i++ {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("read YAML: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		docs = append(docs, document{index: i, data: doc})
	}
}

// collect joins the objects of parsed documents, in file order, and
// their errors.
func collect(docs []document) (*Objects, error) {
	objs := &Objects{}
	var errs []error
	for i := range docs {
		d := &docs[i]
		if d.err != nil {
			errs = append(errs, d.err)
		}
		o := d.objs
		if o == nil {
			continue
		}
		objs.Services = append(objs.Services, o.Services...)
		objs.EndpointSlices = append(objs.EndpointSlices, o.EndpointSlices...)
		objs.Nodes = append(objs.Nodes, o.Nodes...)
		for _, p := range o.ServiceCIDRs {
			if !slices.Contains(objs.ServiceCIDRs, p) {
				objs.ServiceCIDRs = append(objs.ServiceCIDRs, p)
			}
		}
		objs.Documents += o.Documents
	}
	return objs, errors.Join(errs...)
}

// document is one non-empty document of a file, and once parsed its
// objects and error.
type document struct {
	index int
	data  []byte
	objs  *Objects
	err   error
}

// parseChunk is how many documents (or cached objects) a worker of
// inParallel takes at a time.
const parseChunk = 64

// parseAll parses each of docs, on up to GOMAXPROCS goroutines.
func parseAll(docs []document) {
	inParallel(len(docs), func(start, end int) {
		for i := start; i < end; i++ {
			docs[i].parse()
		}
	})
}

// inParallel calls work for chunks [start, end) of parseChunk items
// that cover [0, n), on up to GOMAXPROCS goroutines, and returns when
// every call has.
func inParallel(n int, work func(start, end int)) {
	workers := min(runtime.GOMAXPROCS(0), (n+parseChunk-1)/parseChunk)
	var next atomic.Int64
	worker := func() {
		for {
			end := int(next.Add(parseChunk))
			start := end - parseChunk
			if start >= n {
				return
			}
			work(start, min(end, n))
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(worker)
	}
	worker()
	wg.Wait()
}

// parse decodes the document into d.objs, or sets d.err.
func (d *document) parse() {
	d.objs = &Objects{}
	// Each document is converted to JSON once (the YAML parser is what
	// costs); the peek at its kind and the strict decoding of the object
	// read that JSON.
	j, err := yaml.YAMLToJSONStrict(d.data)
	if err != nil && !decodes(d.data) {
		// E.g. duplicate keys in a kind this package ignores.
		j, err = yaml.YAMLToJSON(d.data)
	}
	if err == nil {
		_, err = d.objs.add(j)
	}
	if err != nil {
		de := &DocumentError{Index: d.index, Err: err}
		var tm typeMeta
		if yaml.Unmarshal(d.data, &tm) == nil {
			de.Kind, de.Name = tm.Kind, tm.name()
		}
		d.err = de
	}
}

// decodes reports whether doc, which does not convert strictly, is
// (or may be) of a kind that add decodes: its error must be reported.
func decodes(doc []byte) bool {
	var tm typeMeta
	if yaml.Unmarshal(doc, &tm) != nil {
		return true // not YAML at all
	}
	switch tm.Kind {
	case "List", "ServiceList", "EndpointSliceList", "NodeList", "ServiceCIDRList", "Service", "EndpointSlice", "Node", "ServiceCIDR", "":
		return true
	}
	return false
}

// strictJSON decodes the JSON document j into v, refusing fields v does
// not have (as yaml.UnmarshalStrict does after its conversion).
func strictJSON(j []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// add adds the objects of the JSON document doc (a document of the file
// converted, or an item of a List) and returns its kind ("" for an empty
// document).
func (o *Objects) add(doc []byte) (string, error) {
	if bytes.Equal(bytes.TrimSpace(doc), []byte("null")) {
		return "", nil // empty or comment-only document
	}
	var tm typeMeta
	if err := json.Unmarshal(doc, &tm); err != nil {
		return "", err
	}
	if tm.Kind == "" {
		return "", errors.New("no kind")
	}
	return tm.Kind, o.addKind(tm.Kind, tm.Items, doc)
}

// addKind adds the objects of the JSON document doc of the kind given
// (a List's with its items), decoding an object strictly.
func (o *Objects) addKind(kind string, items []json.RawMessage, doc []byte) error {
	decode := strictJSON
	o.Documents++
	switch kind {
	case "List", "ServiceList", "EndpointSliceList", "NodeList", "ServiceCIDRList":
		var errs []error
		for i, item := range items {
			if _, err := o.add(item); err != nil {
				errs = append(errs, fmt.Errorf("item %d: %w", i, err))
			}
		}
		return errors.Join(errs...)
	case "Service":
		s := &v1.Service{}
		if err := decode(doc, s); err != nil {
			return fmt.Errorf("Service: %w", err)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		o.Services = append(o.Services, s)
	case "EndpointSlice":
		s := &discoveryv1.EndpointSlice{}
		if err := decode(doc, s); err != nil {
			return fmt.Errorf("EndpointSlice: %w", err)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		o.EndpointSlices = append(o.EndpointSlices, s)
	case "Node":
		n := &v1.Node{}
		if err := decode(doc, n); err != nil {
			return fmt.Errorf("Node: %w", err)
		}
		o.Nodes = append(o.Nodes, n)
	case "ServiceCIDR":
		c := &networkingv1.ServiceCIDR{}
		if err := decode(doc, c); err != nil {
			return fmt.Errorf("ServiceCIDR: %w", err)
		}
		for _, s := range c.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("ServiceCIDR %s: %w", c.Name, err)
			}
			if !slices.Contains(o.ServiceCIDRs, p.Masked()) {
				o.ServiceCIDRs = append(o.ServiceCIDRs, p.Masked())
			}
		}
	}
	return nil
}

// Load parses the file at path; see [Parse].
func Load(path string) (*Objects, error) {
	return LoadWith(path, LoadOptions{})
}

// LoadOptions are the options of [LoadWith].
type LoadOptions struct {
	// CacheDir, when set, is a directory (created if missing) that keeps
	// the objects of the file, once it parsed completely, in the
	// Kubernetes types' protobuf encoding, with the SHA-256 of the
	// file's bytes: a later load of the same bytes decodes them instead
	// of parsing the YAML again, tens of times faster (the YAML parser is
	// what costs). The objects are those of the parse, as
	// equality.Semantic of k8s.io/apimachinery compares them (an empty
	// list or map may come back nil). A cache file of other bytes, of
	// another version of this package's format, of Go, of the object
	// types or of the modules that encode them, or that does not match
	// its own checksum or does not decode is not used (logged) and the
	// file is parsed. One cache file per source path (named by a hash of
	// its absolute path), replaced when the file's content changes.
	CacheDir string
	// Logger receives why a cache file was not used or not written; nil
	// discards.
	Logger *slog.Logger
}

// LoadWith reads the file at path and returns its objects, like [Load],
// using the cache of opts when set. A cache file that cannot be written
// is logged, not an error.
func LoadWith(path string, opts LoadOptions) (*Objects, error) {
	if opts.CacheDir == "" {
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
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &cache{dir: opts.CacheDir, path: path, log: log}
	objs, parsed, sum, err := c.decode(data)
	if err != nil {
		return objs, fmt.Errorf("%s: %w", path, err)
	}
	if parsed && objs.Documents > 0 {
		if err := c.store(sum, len(data), objs); err != nil {
			log.Warn("static source: cannot write the cache file", "path", path, "cache", c.file(), "err", err)
		}
	}
	return objs, nil
}

// Source delivers the objects of a file to a Proxier.
//
// Only a file that parses completely replaces what was delivered. A file
// that is missing, cannot be read, has a document that does not parse,
// or holds no document at all (empty, or comments only, as it is for a
// moment while `>` or cp rewrites it) is no new information: the objects
// delivered last stay in force, the reason is logged, and the file is
// read again at the next interval. To remove every object, write a
// document that says so, such as an empty List:
//
//	apiVersion: v1
//	kind: List
//	items: []
type Source struct {
	// Path is the file to read.
	Path string
	// Watch is the interval at which the file is read again; zero means
	// the file is read once.
	Watch time.Duration
	// Logger receives parse errors; nil discards them.
	Logger *slog.Logger
	// CacheDir, when set, keeps the decoded objects of the file last
	// delivered, so that a restarted process reading the same bytes
	// decodes them instead of parsing the YAML again; see
	// [LoadOptions.CacheDir]. The cache file is written after the
	// objects are delivered (and, the first time, marked synced).
	CacheDir string

	services map[string]*v1.Service
	slices   map[string]*discoveryv1.EndpointSlice
	nodes    map[string]*v1.Node
	cidrs    []netip.Prefix // the service CIDRs delivered last
	last     []byte         // the content last looked at, good or not
	usable   bool           // last parsed completely and was delivered
	// toCache is the parsed content delivered last, until it is written
	// to the cache file.
	toCache *cacheEntry
	// lastWarn and lastWarnAt rate-limit the warning about a file that
	// stays unreadable.
	lastWarn   string
	lastWarnAt time.Time
}

// readWarnInterval is how often an unchanged read error is logged again.
const readWarnInterval = time.Minute

// Run reads the file, delivers its objects to p, marks Services,
// EndpointSlices and Nodes synced, and then, when watching, delivers every
// change until ctx is done. Nothing is delivered or marked synced before
// the file first parses completely: when watching, Run waits for that
// (the file may appear later), logging why; without Watch it returns the
// reason at once.
func (s *Source) Run(ctx context.Context, p proxier.Proxier) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.services = map[string]*v1.Service{}
	s.slices = map[string]*discoveryv1.EndpointSlice{}
	s.nodes = map[string]*v1.Node{}
	s.cidrs = nil
	s.last = nil
	err := s.reload(p, log)
	if err != nil && s.Watch <= 0 {
		return err
	}
	var t *time.Ticker
	if s.Watch > 0 {
		t = time.NewTicker(s.Watch)
		defer t.Stop()
	}
	for err != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			err = s.reload(p, log)
		}
	}
	p.OnServiceSynced()
	p.OnEndpointSlicesSynced()
	p.OnNodeSynced()
	s.storeCache(log)
	if s.Watch <= 0 {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = s.reload(p, log)
			s.storeCache(log)
		}
	}
}

// cacheEntry is a content of the file that parsed completely, to be
// written to the cache.
type cacheEntry struct {
	sum  [sha256.Size]byte
	n    int
	objs *Objects
}

// storeCache writes the content delivered last to the cache file, when
// it was parsed (not read from the cache).
func (s *Source) storeCache(log *slog.Logger) {
	e := s.toCache
	if e == nil {
		return
	}
	s.toCache = nil
	c := &cache{dir: s.CacheDir, path: s.Path, log: log}
	start := time.Now()
	if err := c.store(e.sum, e.n, e.objs); err != nil {
		log.Warn("static source: cannot write the cache file", "path", s.Path, "cache", c.file(), "err", err)
		return
	}
	log.Debug("static source: wrote the cache file", "path", s.Path, "cache", c.file(), "took", time.Since(start))
}

// errUnchanged is reload's answer when the file holds what it held at the
// last look and that was not usable.
var errUnchanged = errors.New("static source: file unchanged")

// reload reads the file and, when it parses completely, delivers the
// difference. It returns nil when the objects delivered match the file,
// else why not (logged once per content, or per readWarnInterval for a
// read error).
func (s *Source) reload(p proxier.Proxier, log *slog.Logger) error {
	data, err := os.ReadFile(s.Path)
	if err != nil {
		if msg := err.Error(); msg != s.lastWarn || time.Since(s.lastWarnAt) >= readWarnInterval {
			s.lastWarn, s.lastWarnAt = msg, time.Now()
			log.Warn("static source: cannot read file; keeping the objects delivered last", "path", s.Path, "err", err)
		}
		s.last = nil
		return err
	}
	if s.lastWarn != "" {
		log.Info("static source: file readable again", "path", s.Path)
		s.lastWarn = ""
	}
	if s.last != nil && bytes.Equal(data, s.last) {
		if s.usable {
			return nil
		}
		return errUnchanged
	}
	s.last, s.usable, s.toCache = data, false, nil
	var objs *Objects
	var entry *cacheEntry
	if s.CacheDir != "" {
		c := &cache{dir: s.CacheDir, path: s.Path, log: log}
		var parsed bool
		var sum [sha256.Size]byte
		objs, parsed, sum, err = c.decode(data)
		if parsed {
			entry = &cacheEntry{sum: sum, n: len(data), objs: objs}
		}
	} else {
		objs, err = Parse(bytes.NewReader(data))
	}
	if err != nil {
		err = fmt.Errorf("static source: %s does not parse completely: %w", s.Path, err)
		log.Warn("static source: file does not parse completely; keeping the objects delivered last until it does", "path", s.Path, "err", err)
		return err
	}
	if objs.Documents == 0 {
		err = fmt.Errorf("static source: %s holds no document (an empty List removes every object)", s.Path)
		log.Warn("static source: file holds no document; keeping the objects delivered last (write an empty List to remove every object)", "path", s.Path, "bytes", len(data))
		return err
	}
	s.usable = true
	s.toCache = entry
	s.deliver(p, objs)
	return nil
}

// deliver hands p the difference between the objects delivered so far and
// objs, and remembers objs.
func (s *Source) deliver(p proxier.Proxier, objs *Objects) {
	key := func(ns, name string) string { return ns + "/" + name }
	s.services = diff(s.services, objs.Services, func(o *v1.Service) string { return key(o.Namespace, o.Name) },
		p.OnServiceAdd, p.OnServiceUpdate, p.OnServiceDelete)
	s.slices = diff(s.slices, objs.EndpointSlices, func(o *discoveryv1.EndpointSlice) string { return key(o.Namespace, o.Name) },
		p.OnEndpointSliceAdd, p.OnEndpointSliceUpdate, p.OnEndpointSliceDelete)
	s.nodes = diff(s.nodes, objs.Nodes, func(o *v1.Node) string { return o.Name },
		p.OnNodeAdd, p.OnNodeUpdate, p.OnNodeDelete)
	if !slices.Equal(s.cidrs, objs.ServiceCIDRs) {
		s.cidrs = slices.Clone(objs.ServiceCIDRs)
		p.OnServiceCIDRsChanged(slices.Clone(s.cidrs))
	}
}

// diff calls add, update and delete for the difference between known (by
// key) and objs, and returns known updated (in place, or a new map when
// known was empty: the first delivery, sized for objs, with nothing to
// delete).
func diff[T any](known map[string]T, objs []T, key func(T) string, add func(T), update func(old, cur T), del func(T)) map[string]T {
	first := len(known) == 0
	var seen map[string]bool
	if first {
		known = make(map[string]T, len(objs))
	} else {
		seen = make(map[string]bool, len(objs))
	}
	for _, o := range objs {
		k := key(o)
		if !first {
			seen[k] = true
		}
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
	if first {
		return known // every key is one of objs'
	}
	for k, old := range known {
		if !seen[k] {
			del(old)
			delete(known, k)
		}
	}
	return known
}
