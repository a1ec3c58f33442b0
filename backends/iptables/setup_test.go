package iptables

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/proxykit/proxykit/internal/iptables"
	"github.com/proxykit/proxykit/proxier"
)

// TestUnsupportedKeepsTimeoutsApart: a missing program is unsupported
// (callers may fall back to another backend), an iptables program that
// did not finish in time is not.
func TestUnsupportedKeepsTimeoutsApart(t *testing.T) {
	missing := unsupported(&iptables.MissingError{Program: "iptables-restore", Err: errors.New("not found")})
	if !errors.Is(missing, proxier.ErrNotSupported) {
		t.Errorf("missing program: %v, want ErrNotSupported", missing)
	}
	slow := unsupported(fmt.Errorf("iptables-nft-save: %w", context.DeadlineExceeded))
	if errors.Is(slow, proxier.ErrNotSupported) || !errors.Is(slow, context.DeadlineExceeded) {
		t.Errorf("timed out program: %v, want a timeout and not ErrNotSupported", slow)
	}
}
