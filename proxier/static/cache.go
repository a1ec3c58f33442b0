package static

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// A cache file holds the documents of one source file that parsed
// completely, converted to JSON (what the YAML parser produced, before
// the objects were decoded from it), so that a later read of the same
// bytes decodes the JSON instead of parsing the YAML again, the part
// that costs. Its layout:
//
//	proxykit-static-cache <format> <Go> types:<shape> <converter versions>
//	source <SHA-256 of the source file, hex> <its length>
//	body <SHA-256 of what follows, hex> <number of documents>
//	<one document's kind> TAB <its JSON>
//	...
//
// one document per line (JSON as encoding/json writes it has no raw
// newline or tab). The kind saves decoding each document twice, once to
// read its kind and once as the object: an object of a kind this
// package decodes is decoded at once, any other document (a List, or a
// kind that is only counted) as parsing does. The objects decoded from a cache file are those the parse
// decoded: the same JSON through the same code (without the check for
// unknown fields, which that JSON passed in types of the same shape). A
// file whose header names another format, Go release, shape of the
// types or converter, another source, or whose body does not match its
// hash is not used.
const (
	cacheMagic  = "proxykit-static-cache"
	cacheFormat = 1
	// cacheHeaderMax bounds the header lines read before they are
	// checked.
	cacheHeaderMax = 4096
)

// cacheVersion is the first line of a cache file this binary writes and
// reads: the format, the Go release, the shape of the object types
// (typeShape) and the YAML converters' versions.
func cacheVersion() string {
	// The modules whose code converts YAML to JSON: a cache file written
	// by other versions of them is not used.
	converters := []string{"sigs.k8s.io/yaml", "go.yaml.in/yaml/v2", "gopkg.in/yaml.v2"}
	h := sha256.New()
	seen := map[reflect.Type]bool{}
	for _, o := range []any{v1.Service{}, discoveryv1.EndpointSlice{}, v1.Node{}, networkingv1.ServiceCIDR{}} {
		typeShape(h, reflect.TypeOf(o), seen)
	}
	v := fmt.Sprintf("%s %d %s types:%x", cacheMagic, cacheFormat, runtime.Version(), h.Sum(nil)[:12])
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			for _, c := range converters {
				if m.Path == c {
					v += " " + m.Path + "@" + m.Version
				}
			}
		}
	}
	return v
}

// typeShape writes to w what decoding JSON into t depends on: the
// names of its named types and, once each, its fields with their tags
// and types. Two binaries that write the same shape accept the same
// fields: JSON that decoded strictly in one has no unknown field in the
// other.
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
// from the cache file when it holds data's documents (docs nil), else
// parsed (docs the parsed documents, to store once used). A cache file
// that cannot be used is logged and parsing decides.
func (c *cache) decode(data []byte) (objs *Objects, docs []document, sum [sha256.Size]byte, err error) {
	sum = sha256.Sum256(data)
	start := time.Now()
	objs, cerr := c.load(sum, len(data))
	switch {
	case cerr == nil:
		c.log.Info("static source: read the decoded documents from the cache", "path", c.path, "cache", c.file(), "documents", objs.Documents, "took", time.Since(start))
		return objs, nil, sum, nil
	case errors.Is(cerr, fs.ErrNotExist):
		c.log.Debug("static source: no cache file; parsing", "path", c.path, "cache", c.file())
	case errors.Is(cerr, errCacheMismatch):
		c.log.Info("static source: the cache holds another content of the file; parsing", "path", c.path, "cache", c.file())
	default:
		c.log.Warn("static source: cannot use the cache file; parsing", "path", c.path, "cache", c.file(), "err", cerr)
	}
	docs, readErr := readDocuments(bytes.NewReader(data))
	parseAll(docs, (*document).parse)
	objs, err = collect(docs)
	if readErr != nil {
		err = readErr
	}
	return objs, docs, sum, err
}

// load reads the cache file and decodes its documents when they are
// those of the source content of hash sum and length n.
func (c *cache) load(sum [sha256.Size]byte, n int) (*Objects, error) {
	f, err := os.Open(c.file())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(io.LimitReader(f, st.Size()), cacheHeaderMax)
	var header [3]string
	headerLen := 0
	for i := range header {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, fmt.Errorf("header: %w", err)
		}
		headerLen += len(line)
		header[i] = string(line[:len(line)-1])
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
	var count int
	if fields := strings.Fields(header[2]); len(fields) == 3 && fields[0] == "body" {
		bodySum = fields[1]
		count, err = strconv.Atoi(fields[2])
	}
	if bodySum == "" || err != nil || count < 0 {
		return nil, fmt.Errorf("header: %q", header[2])
	}
	body := make([]byte, st.Size()-int64(headerLen))
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	if got := sha256.Sum256(body); hex.EncodeToString(got[:]) != bodySum {
		return nil, errors.New("body does not match its hash")
	}
	if count > len(body)/2 {
		return nil, fmt.Errorf("%d documents in %d bytes", count, len(body))
	}
	docs := make([]document, 0, count)
	for len(body) > 0 {
		line, rest, ok := bytes.Cut(body, []byte("\n"))
		if !ok {
			return nil, errors.New("truncated document")
		}
		docs = append(docs, document{index: len(docs), data: line})
		body = rest
	}
	if len(docs) != count {
		return nil, fmt.Errorf("%d documents, header says %d", len(docs), count)
	}
	parseAll(docs, (*document).decodeJSON)
	objs, err := collect(docs)
	if err != nil {
		return nil, err
	}
	return objs, nil
}

// store writes the cache file for the documents docs of the source
// content of hash sum and length n, which parsed completely: to a
// temporary file, renamed over the cache file.
func (c *cache) store(sum [sha256.Size]byte, n int, docs []document) error {
	size := 0
	for i := range docs {
		size += len(docs[i].kind) + len(docs[i].json) + 2
	}
	body := make([]byte, 0, size)
	count := 0
	for i := range docs {
		d := &docs[i]
		if d.kind == "" {
			continue // empty or comment-only
		}
		if d.json == nil || bytes.ContainsAny(d.json, "\t\n") || strings.ContainsAny(d.kind, "\t\n") {
			return fmt.Errorf("document %d: no single-line JSON", d.index)
		}
		body = append(body, d.kind...)
		body = append(body, '\t')
		body = append(append(body, d.json...), '\n')
		count++
	}
	bodySum := sha256.Sum256(body)
	header := fmt.Sprintf("%s\nsource %x %d\nbody %x %d\n", cacheVersion(), sum, n, bodySum, count)
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

// decodeJSON decodes the document, JSON read from a cache file, into
// d.objs, or sets d.err.
func (d *document) decodeJSON() {
	d.objs = &Objects{}
	kind, j, ok := bytes.Cut(d.data, []byte("\t"))
	if !ok {
		d.err = &DocumentError{Index: d.index, Err: errors.New("no kind")}
		return
	}
	var err error
	switch k := string(kind); k {
	case "Service", "EndpointSlice", "Node", "ServiceCIDR":
		// The JSON decoded strictly into types of the same shape (the
		// version line): it has no unknown field, and decoding it
		// without looking for them (json.Unmarshal, not a Decoder) is
		// the same, ~20% faster.
		err = d.objs.addKind(k, nil, j, json.Unmarshal)
	default:
		var got string
		got, err = d.objs.add(j)
		if err == nil && got != k {
			err = fmt.Errorf("kind %q, line says %q", got, k)
		}
	}
	if err != nil {
		d.err = &DocumentError{Index: d.index, Kind: string(kind), Err: err}
	}
}
