package nftables

import (
	"context"
	"errors"
	"fmt"
)

// Cleanup deletes the backend's table of its family, whoever created it.
// Other tables are not touched. It succeeds when there is no table.
func (b *backend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.conn == nil {
		return errors.New("nftables: backend is closed")
	}
	// Adding the table first makes the deletion succeed whether or not
	// it exists, in one transaction.
	tx := newBatch(b.fi.proto, b.cfg.TableName)
	tx.addTable()
	tx.delTable()
	if err := b.conn.commit(tx); err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	b.st = nil
	b.log.Info("deleted table")
	return nil
}

// Close releases the netlink socket and the namespace handle. The table
// stays for a successor to replace.
func (b *backend) Close() error {
	var err error
	if b.conn != nil {
		err = b.conn.close()
		b.conn = nil
	}
	if b.ns != nil {
		err = errors.Join(err, b.ns.Close())
		b.ns = nil
	}
	b.lock.Release()
	return err
}
