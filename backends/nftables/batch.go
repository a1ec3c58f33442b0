package nftables

import (
	"context"

	"github.com/google/nftables/expr"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// The backend writes and reads nf_tables through internal/nftnl: its
// batches, its connection (the kernel's, or a recorder in tests) and its
// rule builders. This file holds the short names the backend's files use.

type (
	// elem is one set or map element.
	elem = nftnl.Elem
	// verdict is a verdict map value.
	verdict = nftnl.Verdict
)

// TxError is a failed transaction: the kernel rejected one or more of its
// messages and applied none of them. A failure's Owner is the
// *model.ServicePortName whose message was rejected, or nil.
type TxError = nftnl.TxError

// TxFailure is one message the kernel rejected.
type TxFailure = nftnl.TxFailure

// nfDrop is the drop verdict.
const nfDrop = nftnl.VerdictDrop

// conn is the backend's nf_tables connection: the kernel's ([dial]), or a
// [nftnl.Recorder] in tests.
type conn struct{ nftnl.Conn }

// dial opens the kernel's connection in ns.
func dial(ns *netns.NS) (*conn, error) {
	c, err := nftnl.Dial(ns)
	if err != nil {
		return nil, err
	}
	return &conn{c}, nil
}

// commit commits tx, for work that has no context of its own (the table
// deletion of Cleanup, whose callers check theirs first).
func (c *conn) commit(tx *batch) error { return c.Commit(context.Background(), tx.Batch) }

func (c *conn) close() error { return c.Close() }

// batch is an nftnl batch; see nftnl.Batch.
type batch struct{ *nftnl.Batch }

// newBatch returns an empty batch on the table.
func newBatch(proto byte, table string) *batch { return &batch{nftnl.NewBatch(proto, table)} }

func (b *batch) addTable() { b.AddTable() }
func (b *batch) delTable() { b.DelTable() }

// owner returns the owner value of a message of svc (nil: none): a nil
// pointer would be a non-nil owner.
func owner(svc *model.ServicePortName) any {
	if svc == nil {
		return nil
	}
	return svc
}

// encodeExprs encodes a rule's expressions (see nftnl.Encode).
func encodeExprs(proto byte, exprs []expr.Any) ([]byte, error) { return nftnl.Encode(proto, exprs) }

// rejectedService returns the service port a failure belongs to, or nil.
func rejectedService(f *TxFailure) *model.ServicePortName {
	svc, _ := f.Owner.(*model.ServicePortName)
	return svc
}
