package ebpf

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/proxykit/proxykit/backends/nftables"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/proxier"
)

// Cleanup removes, without a proxier and without loading programs, what
// the backend's proxiers configured as cfg left behind: the nftables
// table of the north-south rules (cfg.TableName, default
// [DefaultTableName]) of each family of cfg.Families in cfg.NetNS and,
// when cfg.PinPath is set, the pinned links under it (detaching their
// programs from whatever cgroup they are attached to) and the pinned
// maps. Without PinPath, programs die with the proxier that attached
// them: only the table can be left. CgroupPath is not needed. It is for
// --cleanup, or after switching a node to another backend; it succeeds
// when there is nothing to remove.
//
// A table that a live proxier holds is refused, and then nothing is
// removed: the error wraps "held by a running proxier" and names the
// holder. A SocketOnly proxier holds no table, so Cleanup cannot tell
// that it lives: do not clean its PinPath while it runs.
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	err := nftables.Cleanup(ctx, nftables.Config{Config: cfg.Config, TableName: cfg.TableName})
	switch {
	case errors.Is(err, ownerlock.ErrHeld):
		return fmt.Errorf("ebpf: north-south rules: %w", err)
	case errors.Is(err, proxier.ErrNotSupported):
		err = nil // no nf_tables: no table
	case err != nil:
		err = fmt.Errorf("ebpf: north-south rules: %w", err)
	}
	if cfg.PinPath != "" {
		err = errors.Join(err, removePins(cfg.PinPath))
	}
	if err == nil {
		cfg.Logger.Debug("cleaned up", "backend", "ebpf", "table", cfg.TableName, "pins", cfg.PinPath)
	}
	return err
}

// removePins detaches and unpins the links pinned under dir, and removes
// the pinned maps.
func removePins(dir string) error {
	var errs []error
	for _, h := range hooks() {
		l, err := link.LoadPinnedLink(filepath.Join(dir, linkPin(h)), nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("ebpf: load pinned link %s: %w", h.name, err))
			continue
		}
		if err := l.Unpin(); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ebpf: unpin link %s: %w", h.name, err))
		}
		// A link that cannot be detached goes with its last reference,
		// closed here.
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("ebpf: detach %s: %w", h.name, err))
		}
		errs = append(errs, l.Close())
	}
	for _, name := range pinnedMaps() {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ebpf: unpin map %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Cleanup detaches the programs from the cgroup, removes the pins under
// PinPath (also a predecessor's) and deletes the nftables table of the
// backend's family. It succeeds when there is nothing to remove.
func (b *backend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.dp == nil {
		return errClosed
	}
	var errs []error
	if err := b.dp.cleanup(); err != nil {
		errs = append(errs, err)
	}
	if b.nft != nil {
		if err := b.nft.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("ebpf: north-south rules: %w", err))
		}
	}
	b.st = nil
	b.log.Info("cleaned up")
	return errors.Join(errs...)
}

// Close releases the backend's handles. Pinned programs stay attached
// for a successor to adopt; without PinPath, closing the last backend
// of a proxier detaches them.
func (b *backend) Close() error {
	var errs []error
	if b.nft != nil {
		errs = append(errs, b.nft.Close())
		b.nft = nil
	}
	if b.nl != nil {
		b.nl.Close()
		b.nl = nil
	}
	if b.ns != nil {
		errs = append(errs, b.ns.Close())
		b.ns = nil
	}
	if b.dp != nil {
		errs = append(errs, b.dp.release())
		b.dp = nil
	}
	return errors.Join(errs...)
}
