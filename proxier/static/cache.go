package static

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A cache file holds the objects of one source file that parsed
// completely, as the file's parse decoded them, in the Kubernetes
// types' own protobuf encoding (the generated Marshal and Unmarshal
// methods of k8s.io/api, many times faster than JSON's reflection), so
// that a later read of the same bytes decodes them instead of parsing
// the YAML again, the part that costs. Its layout:
//
//	proxykit-static-cache <format> <Go> types:<shape> <codec versions>
//	source <SHA-256 of the source file, hex> <its length>
//	body <SHA-256 of what follows, hex> <documents> <Services> <EndpointSlices> <Nodes> <ServiceCIDRs>
//	<records>
//
// A record is a byte naming what it holds (recService...), the length of
// the rest as a uvarint, and then, for an object, the length of its
// apiVersion (uvarint), the apiVersion and the object's protobuf (which
// does not hold its apiVersion and kind); for a service CIDR, the prefix
// as text. The records are the objects of [Objects] in its order: the
// Services, the EndpointSlices, the Nodes, then the service CIDRs; the
// header counts each, and the documents (Objects.Documents).
//
// The protobuf of an object holds every field of its type, except that
// an empty list or map comes back as nil: the objects read are those the
// parse decoded as apimachinery's equality.Semantic compares them (which
// is how Source compares objects). A file whose header names another
// format, Go release, shape of the types (their protobuf field numbers
// are in the tags the shape holds) or codec version, another source, or
// whose body does not match its hash or does not decode is not used.
const (
	cacheMagic  = "proxykit-static-cache"
	cacheFormat = 2
	// cacheHeaderMax bounds each header line read before it is checked.
	cacheHeaderMax = 4096
)

// The kinds of a cache file's records.
const (
	recService       = 'S'
	recEndpointSlice = 'E'
	recNode          = 'N'
	recServiceCIDR   = 'C'
)

// cacheVersion is the first line of a cache file this binary writes and
// reads: the format, the Go release, the shape of the object types
// (typeShape) and the versions of the modules whose code made and reads
// the objects.
func cacheVersion() string {
	// The YAML converters made the objects from the file; k8s.io/api's
	// generated code and k8s.io/apimachinery's (metadata, quantities,
	// times) encode and decode them. A cache file written by other
	// versions of them is not used.
	codecs := []string{"sigs.k8s.io/yaml", "go.yaml.in/yaml/v2", "gopkg.in/yaml.v2", "k8s.io/api", "k8s.io/apimachinery"}
	h := sha256.New()
	seen := map[reflect.Type]bool{}
	for _, o := range []any{v1.Service{}, discoveryv1.EndpointSlice{}, v1.Node{}, networkingv1.ServiceCIDR{}} {
		typeShape(h, reflect.TypeOf(o), seen)
	}
	v := fmt.Sprintf("%s %d %s types:%x", cacheMagic, cacheFormat, runtime.Version(), h.Sum(nil)[:12])
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			for _, c := range codecs {
				if m.Path == c {
					v += " " + m.Path + "@" + m.Version
				}
			}
		}
	}
	return v
}

// typeShape writes to w what decoding into t depends on: the names of
// its named types and, once each, its fields with their tags (JSON
// names, protobuf field numbers) and types. Two binaries that write the
// same shape accept the same JSON fields and number the same protobuf
// fields alike.
func typeShape(w io.Writer, t reflect.Type, seen map[reflect.Type]bool) {
	fmt.Fprintf(w, "(%s.%s %s", t.PkgPath(), t.Name(), t.Kind())
	defer io.WriteString(w, ")")
	if t.Name() != "" {
		if seen[t] {
			return
		}
		seen[t] = true
	}
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			fmt.Fprintf(w, " %s %t %q ", f.Name, f.Anonymous, f.Tag)
			typeShape(w, f.Type, seen)
		}
	case reflect.Pointer, reflect.Slice:
		typeShape(w, t.Elem(), seen)
	case reflect.Array:
		fmt.Fprintf(w, " %d ", t.Len())
		typeShape(w, t.Elem(), seen)
	case reflect.Map:
		typeShape(w, t.Key(), seen)
		typeShape(w, t.Elem(), seen)
	}
}

// errCacheMismatch is a cache file that is intact but of other content.
var errCacheMismatch = errors.New("cache file holds another content")

// cache is the cache file of one source file in a directory.
type cache struct {
	dir  string
	path string // the source file's, as given
	log  *slog.Logger
}

// file is the cache file's path: one per source file, named by the
// SHA-256 of its absolute path.
func (c *cache) file() string {
	abs, err := filepath.Abs(c.path)
	if err != nil {
		abs = c.path
	}
	h := sha256.Sum256([]byte(abs))
	return filepath.Join(c.dir, "static-"+hex.EncodeToString(h[:16])+".cache")
}

// decode returns the objects of data, the content of the source file:
// from the cache file when it holds data's objects (parsed false), else
// parsed (parsed true: objs are to be stored once used). A cache file
// that cannot be used is logged and parsing decides.
func (c *cache) decode(data []byte) (objs *Objects, parsed bool, sum [sha256.Size]byte, err error) {
	sum = sha256.Sum256(data)
	start := time.Now()
	objs, cerr := c.load(sum, len(data))
	switch {
	case cerr == nil:
		c.log.Info("static source: read the decoded documents from the cache", "path", c.path, "cache", c.file(), "documents", objs.Documents, "took", time.Since(start))
		return objs, false, sum, nil
	case errors.Is(cerr, fs.ErrNotExist):
		c.log.Debug("static source: no cache file; parsing", "path", c.path, "cache", c.file())
	case errors.Is(cerr, errCacheMismatch):
		c.log.Info("static source: the cache holds another content of the file; parsing", "path", c.path, "cache", c.file())
	default:
		c.log.Warn("static source: cannot use the cache file; parsing", "path", c.path, "cache", c.file(), "err", cerr)
	}
	objs, err = Parse(bytes.NewReader(data))
	return objs, true, sum, err
}

// cacheCounts is what the body line of a cache file counts.
type cacheCounts struct {
	documents, services, slices, nodes, cidrs int
}

// load reads the cache file and decodes its objects when they are those
// of the source content of hash sum and length n.
func (c *cache) load(sum [sha256.Size]byte, n int) (*Objects, error) {
	b, err := os.ReadFile(c.file())
	if err != nil {
		return nil, err
	}
	var header [3]string
	for i := range header {
		line, _, ok := bytes.Cut(b[:min(len(b), cacheHeaderMax)], []byte("\n"))
		if !ok {
			return nil, fmt.Errorf("header: %w", io.ErrUnexpectedEOF)
		}
		rest := b[len(line)+1:]
		header[i], b = string(line), rest
	}
	if want := cacheVersion(); header[0] != want {
		return nil, fmt.Errorf("written by %q, this binary reads %q", header[0], want)
	}
	if header[1] != fmt.Sprintf("source %x %d", sum, n) {
		if strings.HasPrefix(header[1], "source ") {
			return nil, errCacheMismatch
		}
		return nil, fmt.Errorf("header: %q", header[1])
	}
	var bodySum string
	var cnt cacheCounts
	if f := strings.Fields(header[2]); len(f) == 7 && f[0] == "body" {
		bodySum = f[1]
		for i, p := range []*int{&cnt.documents, &cnt.services, &cnt.slices, &cnt.nodes, &cnt.cidrs} {
			if *p, err = strconv.Atoi(f[2+i]); err == nil && (*p < 0 || *p > len(b)) {
				err = fmt.Errorf("%d records in %d bytes", *p, len(b))
			}
			if err != nil {
				break
			}
		}
	}
	if bodySum == "" || err != nil {
		return nil, fmt.Errorf("header: %q", header[2])
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != bodySum {
		return nil, errors.New("body does not match its hash")
	}
	return decodeBody(b, cnt)
}

// decodeBody decodes the records of a cache file's body, which the
// header counts.
func decodeBody(body []byte, cnt cacheCounts) (*Objects, error) {
	// One pass finds the records; the objects decode in parallel.
	var recs [4][][]byte // by kind: services, slices, nodes, cidrs
	want := [4]int{cnt.services, cnt.slices, cnt.nodes, cnt.cidrs}
	for i := range recs {
		recs[i] = make([][]byte, 0, want[i])
	}
	order := 0 // records come in that order
	for len(body) > 0 {
		kind := body[0]
		l, k := binary.Uvarint(body[1:])
		if k <= 0 || l > uint64(len(body)-1-k) {
			return nil, errors.New("truncated record")
		}
		rec := body[1+k : 1+k+int(l)]
		body = body[1+k+int(l):]
		i := bytes.IndexByte([]byte{recService, recEndpointSlice, recNode, recServiceCIDR}, kind)
		switch {
		case i < 0:
			return nil, fmt.Errorf("record of kind %q", kind)
		case i < order:
			return nil, fmt.Errorf("record of kind %q after kind %q", kind, "SENC"[order])
		case len(recs[i]) == want[i]:
			return nil, fmt.Errorf("more records of kind %q than the header's %d", kind, want[i])
		}
		order = i
		recs[i] = append(recs[i], rec)
	}
	for i := range recs {
		if len(recs[i]) != want[i] {
			return nil, fmt.Errorf("%d records of kind %q, the header says %d", len(recs[i]), "SENC"[i], want[i])
		}
	}
	objs := &Objects{
		Services:       make([]*v1.Service, len(recs[0])),
		EndpointSlices: make([]*discoveryv1.EndpointSlice, len(recs[1])),
		Nodes:          make([]*v1.Node, len(recs[2])),
		Documents:      cnt.documents,
	}
	for _, r := range recs[3] {
		p, err := netip.ParsePrefix(string(r))
		if err != nil {
			return nil, fmt.Errorf("service CIDR: %w", err)
		}
		objs.ServiceCIDRs = append(objs.ServiceCIDRs, p)
	}
	ns, ne := len(recs[0]), len(recs[1])
	var mu sync.Mutex
	var firstErr error
	inParallel(ns+ne+len(recs[2]), func(start, end int) {
		var av apiVersions
		for i := start; i < end; i++ {
			var err error
			switch {
			case i < ns:
				objs.Services[i], err = decodeRecord[v1.Service](recs[0][i], &av, "Service", nil)
			case i < ns+ne:
				objs.EndpointSlices[i-ns], err = decodeRecord(recs[1][i-ns], &av, "EndpointSlice", sizeEndpoints)
			default:
				objs.Nodes[i-ns-ne], err = decodeRecord[v1.Node](recs[2][i-ns-ne], &av, "Node", nil)
			}
			if err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
				return
			}
		}
	})
	if firstErr != nil {
		return nil, firstErr
	}
	return objs, nil
}

// cmpErr keeps the first error set.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// protoObject is an object type of k8s.io/api (a pointer to T) with its
// generated protobuf code.
type protoObject[T any] interface {
	*T
	Size() int
	MarshalToSizedBuffer([]byte) (int, error)
	Unmarshal([]byte) error
	GetNamespace() string
	GetName() string
}

// objectTypeMeta returns the TypeMeta of o, an object type a cache file holds,
// which its protobuf does not hold.
func objectTypeMeta(o any) *metav1.TypeMeta {
	switch o := o.(type) {
	case *v1.Service:
		return &o.TypeMeta
	case *discoveryv1.EndpointSlice:
		return &o.TypeMeta
	case *v1.Node:
		return &o.TypeMeta
	}
	panic(fmt.Sprintf("static: no TypeMeta for %T", o))
}

// apiVersions keeps the apiVersion strings a worker made, so that the
// objects of one apiVersion share one string.
type apiVersions []string

// get returns b as a string, one already made if any.
func (a *apiVersions) get(b []byte) string {
	for _, s := range *a {
		if s == string(b) {
			return s
		}
	}
	s := string(b)
	*a = append(*a, s)
	return s
}

// decodeRecord decodes the record of an object of kind: its apiVersion
// and its protobuf. prepare, if set, readies the new object for its
// protobuf (sizes its lists).
func decodeRecord[T any, P protoObject[T]](rec []byte, av *apiVersions, kind string, prepare func(*T, []byte)) (*T, error) {
	l, k := binary.Uvarint(rec)
	if k <= 0 || l > uint64(len(rec)-k) {
		return nil, fmt.Errorf("%s: truncated apiVersion", kind)
	}
	pb := rec[k+int(l):]
	o := P(new(T))
	if prepare != nil {
		prepare(o, pb)
	}
	if err := o.Unmarshal(pb); err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	tm := objectTypeMeta(o)
	tm.APIVersion, tm.Kind = av.get(rec[k:k+int(l)]), kind
	return o, nil
}

// sizeEndpoints gives s the capacity for the endpoints of pb, its
// protobuf: the generated code appends them one at a time, and growing
// the list of large structs was a quarter of the decoding's time.
func sizeEndpoints(s *discoveryv1.EndpointSlice, pb []byte) {
	const endpointsField = 2 // EndpointSlice.endpoints in generated.proto
	if n := protoCount(pb, endpointsField); n > 0 {
		s.Endpoints = make([]discoveryv1.Endpoint, 0, n)
	}
}

// protoCount returns how many times the protobuf message b holds the
// length-delimited field num at its top level, as far as b scans (a
// hint: the generated code checks the message).
func protoCount(b []byte, num uint64) int {
	n := 0
	for len(b) > 0 {
		tag, k := binary.Uvarint(b)
		if k <= 0 {
			return n
		}
		b = b[k:]
		var skip uint64
		switch tag & 7 {
		case 0: // varint
			_, k = binary.Uvarint(b)
			if k <= 0 {
				return n
			}
			skip = uint64(k)
		case 1: // 64 bits
			skip = 8
		case 2: // length-delimited
			l, k := binary.Uvarint(b)
			if k <= 0 {
				return n
			}
			if tag>>3 == num {
				n++
			}
			skip = uint64(k) + l
		case 5: // 32 bits
			skip = 4
		default:
			return n
		}
		if skip > uint64(len(b)) {
			return n
		}
		b = b[skip:]
	}
	return n
}

// store writes the cache file for objs, the objects of the source
// content of hash sum and length n, which parsed completely: to a
// temporary file, renamed over the cache file.
func (c *cache) store(sum [sha256.Size]byte, n int, objs *Objects) (err error) {
	defer func() {
		// The generated code writes the size it computed first: an
		// object changed in between (by its user, against the rules
		// of shared objects) can make it write outside its bytes.
		if r := recover(); r != nil {
			err = fmt.Errorf("encoding an object: %v", r)
		}
	}()
	var body []byte
	for _, s := range objs.Services {
		if body, err = appendObject(body, recService, s); err != nil {
			return err
		}
	}
	for _, s := range objs.EndpointSlices {
		if body, err = appendObject(body, recEndpointSlice, s); err != nil {
			return err
		}
	}
	for _, nd := range objs.Nodes {
		// A copy: encoding a Quantity (a Node's capacity) caches its
		// text in it, a write to an object others may be reading.
		if body, err = appendObject(body, recNode, nd.DeepCopy()); err != nil {
			return err
		}
	}
	for _, p := range objs.ServiceCIDRs {
		t := p.String()
		body = append(body, recServiceCIDR)
		body = binary.AppendUvarint(body, uint64(len(t)))
		body = append(body, t...)
	}
	bodySum := sha256.Sum256(body)
	header := fmt.Sprintf("%s\nsource %x %d\nbody %x %d %d %d %d %d\n", cacheVersion(), sum, n, bodySum,
		objs.Documents, len(objs.Services), len(objs.EndpointSlices), len(objs.Nodes), len(objs.ServiceCIDRs))
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".static-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, nothing to remove
	if _, err := tmp.WriteString(header); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(body); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.file())
}

// appendObject appends the record of o, of kind rec, to body.
func appendObject[T any, P protoObject[T]](body []byte, rec byte, o P) ([]byte, error) {
	av := objectTypeMeta(o).APIVersion
	size := o.Size()
	n := binary.PutUvarint(make([]byte, binary.MaxVarintLen64), uint64(len(av)))
	body = append(body, rec)
	body = binary.AppendUvarint(body, uint64(n+len(av)+size))
	body = binary.AppendUvarint(body, uint64(len(av)))
	body = append(body, av...)
	body = slices.Grow(body, size)
	m, err := o.MarshalToSizedBuffer(body[len(body) : len(body)+size])
	if err == nil && m != size {
		err = fmt.Errorf("%d bytes, %d expected", m, size)
	}
	if err != nil {
		return body, fmt.Errorf("%T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
	}
	return body[:len(body)+size], nil
}
