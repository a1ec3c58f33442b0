package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	mipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/internal/ownerlock"
	"github.com/proxykit/proxykit/model"
)

// Cleanup removes, without a proxier, everything the backend creates in
// the namespace cfg.NetNS, of both IP families, whoever created it: the
// virtual servers on the dummy interface's addresses (cfg.InterfaceName)
// or recorded in the backend's tables (cfg.TableName), the tables, and
// the dummy interface; defaults when the names are unset. Other virtual
// servers, tables and interfaces are not touched, and the
// namespace-wide sysctls the backend set stay. It is for --cleanup, or
// after switching a node to another backend; it succeeds when there is
// nothing to remove. On a kernel without IPVS, which can hold no virtual
// server, it removes the tables and the interface.
//
// What a live proxier holds (the table of either family) is refused and
// kept: the error wraps "held by a running proxier" and names the
// holder.
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := ctx.Err(); err != nil {
		return err
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	defer ns.Close()
	// The interface serves both families: refuse if a proxier of
	// either lives.
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		lock, err := ownerlock.Acquire(ns, ownerObject(f, cfg.TableName))
		if err != nil {
			return fmt.Errorf("ipvs: cleanup: %w", err)
		}
		defer lock.Release()
	}
	nl, err := ns.NetlinkHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
	if err != nil {
		return fmt.Errorf("ipvs: netlink handle: %w", err)
	}
	defer nl.Close()
	c := cleaner{links: &links{h: nl, name: cfg.InterfaceName}, table: cfg.TableName}
	if _, err := nl.GenlFamilyGet("IPVS"); err == nil {
		// moby/ipvs opens its socket in the calling thread's namespace.
		if err := ns.Do(func() error {
			var err error
			c.ipvs, err = mipvs.New("")
			return err
		}); err != nil {
			return fmt.Errorf("ipvs: open IPVS netlink socket: %w", err)
		}
		defer c.ipvs.Close()
	}
	if c.nft, err = dialNft(ns); err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	defer c.nft.close()
	if err := c.run(nil); err != nil {
		return err
	}
	cfg.Logger.Debug("cleaned up", "backend", "ipvs", "table", cfg.TableName, "interface", cfg.InterfaceName)
	return nil
}

// ownerObject is what the proxier of a family's table locks (see
// internal/ownerlock).
func ownerObject(f model.IPFamily, table string) string {
	return fmt.Sprintf("ipvs %s %s", f, table)
}

// cleaner removes what the backend creates, with handles in the
// namespace.
type cleaner struct {
	links *links
	nft   *nftConn
	ipvs  *mipvs.Handle // nil: the kernel has no IPVS
	table string
}

// run removes the virtual servers on the interface's addresses, in the
// tables or in known(family) (may be nil), the tables of both families
// and the interface.
func (c cleaner) run(known func(model.IPFamily) []vsKey) error {
	link, err := c.links.find()
	if err != nil {
		return fmt.Errorf("ipvs: cleanup: %w", err)
	}
	var errs []error
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		fi := newFamily(f, c.table)
		owned := map[vsKey]bool{}
		keys, err := c.nft.virtualServers(&fi)
		if err != nil {
			errs = append(errs, fmt.Errorf("read table %s: %w", c.table, err))
		}
		for _, k := range keys {
			owned[k] = true
		}
		bound := map[netip.Addr]bool{}
		if link != nil {
			addrs, err := c.links.addrs(link, f)
			if err != nil {
				errs = append(errs, err)
			}
			for _, a := range addrs {
				bound[a] = true
			}
		}
		if known != nil {
			for _, k := range known(f) {
				owned[k] = true
			}
		}
		if c.ipvs != nil {
			t := &ipvsTable{h: c.ipvs, fam: f}
			kvs, err := t.list()
			if err != nil {
				errs = append(errs, err)
			}
			for _, k := range kvs {
				if owned[k.Key] || bound[k.Key.Addr] {
					if err := t.remove(k.Key); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
		if err := c.nft.deleteTable(fi.table); err != nil {
			errs = append(errs, fmt.Errorf("delete table %s: %w", c.table, err))
		}
	}
	if err := c.links.remove(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ipvs: cleanup: %w", err)
	}
	return nil
}

// Cleanup removes everything the backend creates in its namespace, of
// both IP families, whoever created it: the virtual servers on the dummy
// interface's addresses or recorded in the backend's tables, the tables,
// and the dummy interface. Other virtual servers, tables and interfaces
// are not touched. It succeeds when there is nothing to remove.
// The namespace-wide sysctls the backend set stay.
func (b *backend) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.nl == nil {
		return errors.New("ipvs: backend is closed")
	}
	c := cleaner{links: b.links, nft: b.nft, ipvs: b.ipvs.h, table: b.cfg.TableName}
	err := c.run(func(f model.IPFamily) []vsKey {
		if f != b.fi.fam || b.st == nil {
			return nil
		}
		keys := make([]vsKey, 0, len(b.st.vs))
		for k := range b.st.vs {
			keys = append(keys, k)
		}
		return keys
	})
	b.st, b.link = nil, nil
	clear(b.draining)
	if err != nil {
		return err
	}
	b.log.Info("cleaned up")
	return nil
}

// Close releases the backend's handles. The dataplane stays for a
// successor to adopt.
func (b *backend) Close() error {
	var errs []error
	if b.ipvs != nil {
		b.ipvs.h.Close()
		b.ipvs = nil
	}
	if b.nft != nil {
		errs = append(errs, b.nft.close())
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
	b.lock.Release()
	return errors.Join(errs...)
}
