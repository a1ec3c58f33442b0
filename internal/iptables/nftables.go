package iptables

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/nftnl"
	"github.com/proxykit/proxykit/model"
)

// DeleteTableIfEmpty deletes the nf_tables table behind an iptables table
// of the nft flavour (e.g. "ip nat" for iptables' nat) when it holds
// nothing: no chain, set, map, object or flowtable. iptables-nft creates
// such a table on first use and never deletes it, not even when its last
// chain goes; without this, a clean-up would leave an empty "table ip
// nat {}" behind. The check and the deletion are one kernel operation
// (NLM_F_NONREC), so a chain another program adds concurrently is never
// lost. It reports whether the table was deleted; a table in use or
// absent is not an error. For the legacy flavour it does nothing. The
// batch goes through internal/nftnl, on a socket opened in the runner's
// namespace.
func (r *Runner) DeleteTableIfEmpty(ctx context.Context, table string) (bool, error) {
	if r.tools.Flavour != NFT {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	fam := r.nftProto()
	c, err := nftnl.Dial(r.ns)
	if err != nil {
		return false, fmt.Errorf("delete nf_tables table %s: %w", table, err)
	}
	defer c.Close()
	tx := nftnl.NewBatch(fam, table)
	tx.DelTableIfEmpty()
	err = c.Commit(ctx, tx)
	var txErr *nftnl.TxError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &txErr) && (errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOENT)):
		return false, nil
	}
	return false, fmt.Errorf("delete nf_tables table %s: %w", table, err)
}

// Chains returns the names of the chains of each table (e.g. "nat") of
// the runner's family, read over netlink in one dump, for the nft
// flavour, whose tables are nf_tables tables: a dump of the chains alone,
// where *-save reads and prints every rule of every table (over a minute
// at 30,000 services). ok is false for the legacy flavour, which has no
// such list.
func (r *Runner) Chains(ctx context.Context) (byTable map[string][]string, ok bool, err error) {
	byTable, _, ok, err = r.chains(ctx, false)
	return byTable, ok, err
}

// ChainsChecked is [Runner.Chains] for a caller that lists while the
// tables may change (a check running beside the syncs): interrupted
// says the kernel saw a change during the dump, which may then miss a
// chain or list one twice, and ctx ending stops the dump. The dump costs
// the kernel time quadratic in the family's chains (about 7 s of CPU for
// 332,000 chains on a 2-CPU machine).
func (r *Runner) ChainsChecked(ctx context.Context) (byTable map[string][]string, interrupted, ok bool, err error) {
	return r.chains(ctx, true)
}

func (r *Runner) chains(ctx context.Context, checked bool) (byTable map[string][]string, interrupted, ok bool, err error) {
	if r.tools.Flavour != NFT {
		return nil, false, false, nil
	}
	fam := r.nftProto()
	c, err := nftnl.Dial(r.ns)
	if err != nil {
		return nil, false, true, fmt.Errorf("list chains: %w", err)
	}
	defer c.Close()
	if checked {
		byTable, interrupted, err = c.ChainsByTableChecked(ctx, fam)
	} else {
		byTable, err = c.ChainsByTable(ctx, fam)
	}
	if err != nil {
		return nil, false, true, fmt.Errorf("list chains: %w", err)
	}
	return byTable, interrupted, true, nil
}

// ChainsExist reports which of chains the table holds, for the nft
// flavour: one GETCHAIN each, which costs the same however many chains
// the table holds. ok is false for the legacy flavour.
func (r *Runner) ChainsExist(ctx context.Context, table string, chains []string) (exist map[string]bool, ok bool, err error) {
	if r.tools.Flavour != NFT {
		return nil, false, nil
	}
	fam := r.nftProto()
	c, err := nftnl.Dial(r.ns)
	if err != nil {
		return nil, true, fmt.Errorf("look chains up: %w", err)
	}
	defer c.Close()
	exist = make(map[string]bool, len(chains))
	for _, ch := range chains {
		found, err := c.ChainExists(ctx, fam, table, ch)
		if err != nil {
			return nil, true, fmt.Errorf("look chain %s up: %w", ch, err)
		}
		exist[ch] = found
	}
	return exist, true, nil
}

// nftProto is the nf_tables family of the runner's IP family.
func (r *Runner) nftProto() uint8 {
	if r.tools.Family == model.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}
