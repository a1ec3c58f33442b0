package nftables

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Cleanup deletes the backend's table (cfg.TableName, default
// [DefaultTableName]) of each family of cfg.Families in the namespace
// cfg.NetNS, whoever created it, without a proxier: for --cleanup, or
// after switching a node to another backend. Other tables are not
// touched. It succeeds when there is no table.
//
// A table that a live proxier holds is refused and kept: the error wraps
// "held by a running proxier" and names the holder. A kernel without
// nf_tables cannot hold a table: the error then matches
// [proxier.ErrNotSupported].
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer ns.Close()
	var errs []error
	for _, f := range cfg.Families {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := cleanupFamily(ns, cfg, f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupFamily deletes the table of family f, holding its lock.
func cleanupFamily(ns *netns.NS, cfg Config, f model.IPFamily) error {
	object := ownerObject(f, cfg.TableName)
	lock, err := ownerlock.Acquire(ns, object)
	if err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	defer lock.Release()
	c, err := dial(ns)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return &proxier.UnsupportedError{Backend: "nftables", What: "nf_tables netlink", Err: err}
		}
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.close()
	if err := deleteTable(c, familyInfoOf(f).proto, cfg.TableName); err != nil {
		return err
	}
	cfg.Logger.Debug("deleted table if any", "backend", "nftables", "family", f.String(), "table", cfg.TableName)
	return nil
}

// ownerObject is what the proxier of a table locks (see
// internal/ownerlock): "nftables ip NAME" or "nftables ip6 NAME".
func ownerObject(f model.IPFamily, table string) string {
	tfam := "ip"
	if f == model.IPv6 {
		tfam = "ip6"
	}
	return fmt.Sprintf("nftables %s %s", tfam, table)
}

// deleteTable deletes the table of protocol family proto, if it exists.
func deleteTable(c *conn, proto byte, table string) error {
	// Adding the table first makes the deletion succeed whether or not
	// it exists, in one transaction.
	tx := newBatch(proto, table)
	tx.addTable()
	tx.delTable()
	if err := c.commit(tx); err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	return nil
}

// Cleanup deletes the backend's table of its family, whoever created it.
// Other tables are not touched. It succeeds when there is no table.
func (b *backend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.conn == nil {
		return errors.New("nftables: backend is closed")
	}
	if err := deleteTable(b.conn, b.fi.proto, b.cfg.TableName); err != nil {
		return err
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
