package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/proxykit/proxykit/model"
)

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
	link, err := b.links.find()
	if err != nil {
		return fmt.Errorf("ipvs: cleanup: %w", err)
	}
	var errs []error
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		fi := newFamily(f, b.cfg.TableName)
		owned := map[vsKey]bool{}
		keys, err := b.nft.virtualServers(&fi)
		if err != nil {
			errs = append(errs, fmt.Errorf("read table %s: %w", b.cfg.TableName, err))
		}
		for _, k := range keys {
			owned[k] = true
		}
		bound := map[netip.Addr]bool{}
		if link != nil {
			addrs, err := b.links.addrs(link, f)
			if err != nil {
				errs = append(errs, err)
			}
			for _, a := range addrs {
				bound[a] = true
			}
		}
		if f == b.fi.fam && b.st != nil {
			for k := range b.st.vs {
				owned[k] = true
			}
		}
		t := &ipvsTable{h: b.ipvs.h, fam: f}
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
		if err := b.nft.deleteTable(fi.table); err != nil {
			errs = append(errs, fmt.Errorf("delete table %s: %w", b.cfg.TableName, err))
		}
	}
	if err := b.links.remove(); err != nil {
		errs = append(errs, err)
	}
	b.st, b.link = nil, nil
	clear(b.draining)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ipvs: cleanup: %w", err)
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
