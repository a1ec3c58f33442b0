//go:build !linux

package conntrack

import (
	"errors"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
)

// Cleaner deletes stale flows; off Linux there is no conntrack table.
type Cleaner struct{}

// Open fails off Linux.
func Open(ns *netns.NS) (*Cleaner, error) { return nil, errors.New("conntrack cleanup needs Linux") }

// Close does nothing.
func (c *Cleaner) Close() {}

// Clean fails off Linux, which has no conntrack table.
func (c *Cleaner) Clean(family model.IPFamily, valid Valid) (int, error) {
	if len(valid) == 0 {
		return 0, nil
	}
	return 0, errors.New("conntrack cleanup needs Linux")
}
