package iptables

import (
	"sort"

	"github.com/proxykit/proxykit/model"
)

// This file writes iptables-restore inputs and remembers which object
// wrote each line, so that a failing line can be mapped back to it.

// spanKind says what wrote a range of lines.
type spanKind uint8

const (
	spanFixed   spanKind = iota // table headers, fixed chains, stale chains
	spanService                 // a service port's chains and rules
	spanCanary                  // the canary check of a partial sync
	spanJump                    // the check of a jump from a built-in chain
)

// span is a range of input lines [start, end) written for one object.
type span struct {
	start, end int
	kind       spanKind
	table      table
	svc        model.ServicePortName
}

// spanRec is how an input keeps a span: a complete rewrite has one per
// chain declaration, so it is small.
type spanRec struct {
	start, end int32
	kind       spanKind
	table      uint8
	svc        *model.ServicePortName // nil: none
}

// input is an iptables-restore input being written.
type input struct {
	b     []byte
	lines int
	spans []spanRec
	// tableEnd[t] is the line after table t's COMMIT, 0 if absent.
	tableEnd [numTables]int
	cur      table
	// svcs are the service ports whose chains the input writes in full.
	svcs []model.ServicePortName
	// fingerprint is the fingerprint rule's comment the input writes
	// (the last input of a complete rewrite), if any; unprints is set
	// when the input flushes the fingerprint chain.
	fingerprint string
	unprints    bool
}

func newInput(sizeHint int) *input { return &input{b: make([]byte, 0, sizeHint)} }

// mark starts a span: the lines written from now on belong to it. svc
// (nil: none) must stay unchanged while the input is in use.
func (in *input) mark(kind spanKind, svc *model.ServicePortName) {
	if n := len(in.spans); n > 0 {
		if o := &in.spans[n-1]; o.end < 0 && o.kind == kind && o.svc == svc && table(o.table) == in.cur {
			return // the open span continues
		}
	}
	in.close()
	in.spans = append(in.spans, spanRec{start: int32(in.lines), end: -1, kind: kind, table: uint8(in.cur), svc: svc})
}

// close ends the open span, dropping it if it holds no line.
func (in *input) close() {
	n := len(in.spans)
	if n == 0 || in.spans[n-1].end >= 0 {
		return
	}
	if int(in.spans[n-1].start) == in.lines {
		in.spans = in.spans[:n-1]
		return
	}
	in.spans[n-1].end = int32(in.lines)
}

func (in *input) fixed() { in.mark(spanFixed, nil) }

// line writes one line made of parts.
func (in *input) line(parts ...string) {
	for _, p := range parts {
		in.b = append(in.b, p...)
	}
	in.b = append(in.b, '\n')
	in.lines++
}

func (in *input) begin(t table) {
	in.cur = t
	in.fixed()
	in.line("*", t.String())
}

func (in *input) commit() {
	in.fixed()
	in.line("COMMIT")
	in.close()
	in.tableEnd[in.cur] = in.lines
}

func (in *input) declare(chain string) { in.line(":", chain, " - [0:0]") }

func (in *input) appendRule(chain, rule string) { in.line("-A ", chain, " ", rule) }

// lookup returns the span of 1-based line n.
func (in *input) lookup(n int) (span, bool) {
	i := int32(n - 1)
	k := sort.Search(len(in.spans), func(j int) bool { return in.spans[j].end > i })
	if k < len(in.spans) && in.spans[k].start <= i {
		r := in.spans[k]
		sp := span{start: int(r.start), end: int(r.end), kind: r.kind, table: table(r.table)}
		if r.svc != nil {
			sp.svc = *r.svc
		}
		return sp, true
	}
	return span{}, false
}

// committedBefore reports whether table t ends before 1-based line n, so
// that it was committed when line n failed.
func (in *input) committedBefore(t table, n int) bool {
	return in.tableEnd[t] > 0 && in.tableEnd[t] < n
}
