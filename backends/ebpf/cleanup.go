package ebpf

import (
	"context"
	"errors"
	"fmt"
)

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
