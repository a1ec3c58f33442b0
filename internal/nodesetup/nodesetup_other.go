//go:build !linux

package nodesetup

import (
	"context"
	"fmt"
)

// Apply fails with [ErrNotSupported] off Linux, after validating cfg.
func Apply(ctx context.Context, cfg Config) ([]Change, error) {
	if err := validate(cfg); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("nodesetup: %w", ErrNotSupported)
}

// Plan fails with [ErrNotSupported] off Linux, after validating cfg.
func Plan(ctx context.Context, cfg Config) ([]Change, error) {
	return Apply(ctx, cfg)
}
