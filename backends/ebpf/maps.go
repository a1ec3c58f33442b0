package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// Map names, as in bpf/sock.c and bpf/destroy.c, and as pinned under
// Config.PinPath.
const (
	mapSvc4  = "pk_svc4"
	mapSvc6  = "pk_svc6"
	mapBe4   = "pk_be4"
	mapBe6   = "pk_be6"
	mapAff4  = "pk_aff4"
	mapAff6  = "pk_aff6"
	mapRev   = "pk_rev"
	mapNetNS = "pk_netns"
	mapNode4 = "pk_node4"
	mapNode6 = "pk_node6"
	mapStale = "pk_stale"
	mapMag4  = "pk_maglev4"
	mapMag6  = "pk_maglev6"
)

// Kernel representations of the map keys and values, laid out as the
// structs of bpf/sock.c (TestMapLayout checks them against the objects'
// BTF). Ports are in network byte order; the other integers in host
// order.

type svc4Key struct {
	Addr  [4]byte
	Port  [2]byte
	Proto uint8
	Pad   uint8
}

type svc6Key struct {
	Addr  [16]byte
	Port  [2]byte
	Proto uint8
	Pad   uint8
}

// svcVal is a frontend's value: its endpoint group and how to pick.
type svcVal struct {
	ID          uint32
	Count       uint32
	AffinitySec uint32
	Flags       uint32
}

// svcDrop marks a frontend whose traffic has no endpoint on this node
// although the service has some elsewhere: connect fails with EPERM.
const svcDrop = 1

// svcMaglev marks a frontend whose group picks with its Maglev table
// (pk_maglev4/6) rather than at random.
const svcMaglev = 2

// svcNodeOnly marks a frontend that applies to the sockets of the node's
// own namespace only (a load-balancer IP with source ranges, north-south
// at tc): other namespaces' sockets pass untranslated.
const svcNodeOnly = 4

type beKey struct {
	ID   uint32
	Slot uint32
}

type be4Val struct {
	Addr [4]byte
	Port [2]byte
	Pad  uint16
}

type be6Val struct {
	Addr [16]byte
	Port [2]byte
	Pad  uint16
}

// staleKey is a (removed endpoint, service frontend) pair of a UDP
// service, both IPv4-mapped for IPv4.
type staleKey struct {
	BeAddr  [16]byte
	SvcAddr [16]byte
	BePort  [2]byte
	SvcPort [2]byte
	Pad     uint32
}

// affKey and affVal are a session affinity entry: a client network
// namespace's endpoint in a group. Written by the programs only.
type affKey struct {
	NetNS uint64
	ID    uint32
	Pad   uint32
}

type affVal struct {
	TS   uint64
	Addr [16]byte
	Port [2]byte
	Pad  uint16
	Slot uint32
}

// revKey and revVal are the reverse translation of a socket. Written by
// the programs only.
type revKey struct {
	Cookie uint64
	Addr   [16]byte
	Port   [2]byte
	Pad1   uint16
	Pad2   uint32
}

type revVal struct {
	Addr [16]byte
	Port [2]byte
	Pad  uint16
}

// feKey is a frontend, family-neutral: an address (the unspecified
// address of the family for a node port on every node address), a port
// and a protocol.
type feKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

func (k feKey) String() string {
	p := "tcp"
	if k.proto == unix.IPPROTO_UDP {
		p = "udp"
	}
	if k.addr.IsUnspecified() {
		return fmt.Sprintf("node port %d/%s", k.port, p)
	}
	return netip.AddrPortFrom(k.addr, k.port).String() + "/" + p
}

// protoNumber returns the IP protocol number of p, or 0 for a protocol
// the socket programs do not handle (SCTP).
func protoNumber(p model.Protocol) uint8 {
	if p == model.SCTP {
		return 0
	}
	return p.Number()
}

func be16(p uint16) (b [2]byte) {
	binary.BigEndian.PutUint16(b[:], p)
	return b
}

func port16(b [2]byte) uint16 { return binary.BigEndian.Uint16(b[:]) }

// mapped16 returns a as 16 bytes, IPv4-mapped for IPv4.
func mapped16(a netip.Addr) [16]byte {
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16()
	}
	return a.As16()
}

// codec converts between the family-neutral keys and values and the
// kernel's, for one family's maps, and reads and writes them.
type codec interface {
	putSvc(m *ebpf.Map, keys []feKey, vals []svcVal) error
	delSvc(m *ebpf.Map, keys []feKey) error
	readSvc(m *ebpf.Map) (map[feKey]svcVal, error)
	// putBe writes the slots keys (with vals) and every slot of groups.
	putBe(m *ebpf.Map, keys []beKey, vals []netip.AddrPort, groups []*group) error
	readBe(m *ebpf.Map) (map[beKey]netip.AddrPort, error)
	scanBe(m *ebpf.Map, fn func(beKey, netip.AddrPort)) error
	putNode(m *ebpf.Map, addrs []netip.Addr) error
	delNode(m *ebpf.Map, addrs []netip.Addr) error
	readNode(m *ebpf.Map) (map[netip.Addr]bool, error)
}

func codecFor(f model.IPFamily) codec {
	if f == model.IPv6 {
		return codec6{}
	}
	return codec4{}
}

func convert[F, T any](in []F, fn func(F) T) []T {
	out := make([]T, len(in))
	for i, e := range in {
		out[i] = fn(e)
	}
	return out
}

// encodeSlots returns the keys and kernel values of the slots keys
// (with vals) and of every slot of groups, in that order.
func encodeSlots[V any](keys []beKey, vals []netip.AddrPort, groups []*group, enc func(netip.AddrPort) V) ([]beKey, []V) {
	if len(groups) == 0 {
		return keys, convert(vals, enc)
	}
	n := len(keys)
	for _, g := range groups {
		n += len(g.eps)
	}
	outK := append(make([]beKey, 0, n), keys...)
	outV := make([]V, len(vals), n)
	for i, v := range vals {
		outV[i] = enc(v)
	}
	for _, g := range groups {
		for i, ep := range g.eps {
			outK = append(outK, beKey{ID: g.id, Slot: uint32(i)})
			outV = append(outV, enc(ep))
		}
	}
	return outK, outV
}

type codec4 struct{}

func svc4KeyOf(k feKey) svc4Key {
	return svc4Key{Addr: k.addr.As4(), Port: be16(k.port), Proto: k.proto}
}

func be4ValOf(v netip.AddrPort) be4Val {
	return be4Val{Addr: v.Addr().As4(), Port: be16(v.Port())}
}

func (codec4) putSvc(m *ebpf.Map, keys []feKey, vals []svcVal) error {
	return batchPut(m, convert(keys, svc4KeyOf), vals)
}

func (codec4) delSvc(m *ebpf.Map, keys []feKey) error {
	return batchDel(m, convert(keys, svc4KeyOf))
}

func (codec4) readSvc(m *ebpf.Map) (map[feKey]svcVal, error) {
	out := map[feKey]svcVal{}
	err := readAll(m, func(k svc4Key, v svcVal) {
		out[feKey{addr: netip.AddrFrom4(k.Addr), port: port16(k.Port), proto: k.Proto}] = v
	})
	return out, err
}

func (codec4) putBe(m *ebpf.Map, keys []beKey, vals []netip.AddrPort, groups []*group) error {
	k, v := encodeSlots(keys, vals, groups, be4ValOf)
	return batchPut(m, k, v)
}

func (c codec4) readBe(m *ebpf.Map) (map[beKey]netip.AddrPort, error) {
	out := map[beKey]netip.AddrPort{}
	err := c.scanBe(m, func(k beKey, v netip.AddrPort) { out[k] = v })
	return out, err
}

func (codec4) scanBe(m *ebpf.Map, fn func(beKey, netip.AddrPort)) error {
	return readAll(m, func(k beKey, v be4Val) {
		fn(k, netip.AddrPortFrom(netip.AddrFrom4(v.Addr), port16(v.Port)))
	})
}

func (codec4) putNode(m *ebpf.Map, addrs []netip.Addr) error {
	return batchPut(m, convert(addrs, netip.Addr.As4), make([]uint8, len(addrs)))
}

func (codec4) delNode(m *ebpf.Map, addrs []netip.Addr) error {
	return batchDel(m, convert(addrs, netip.Addr.As4))
}

func (codec4) readNode(m *ebpf.Map) (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	err := readAll(m, func(k [4]byte, _ uint8) { out[netip.AddrFrom4(k)] = true })
	return out, err
}

type codec6 struct{}

func svc6KeyOf(k feKey) svc6Key {
	return svc6Key{Addr: k.addr.As16(), Port: be16(k.port), Proto: k.proto}
}

func be6ValOf(v netip.AddrPort) be6Val {
	return be6Val{Addr: v.Addr().As16(), Port: be16(v.Port())}
}

// The IPv6 node address map is keyed like pk_svc6, with port and
// protocol 0.
func node6KeyOf(a netip.Addr) svc6Key { return svc6Key{Addr: a.As16()} }

func (codec6) putSvc(m *ebpf.Map, keys []feKey, vals []svcVal) error {
	return batchPut(m, convert(keys, svc6KeyOf), vals)
}

func (codec6) delSvc(m *ebpf.Map, keys []feKey) error {
	return batchDel(m, convert(keys, svc6KeyOf))
}

func (codec6) readSvc(m *ebpf.Map) (map[feKey]svcVal, error) {
	out := map[feKey]svcVal{}
	err := readAll(m, func(k svc6Key, v svcVal) {
		out[feKey{addr: netip.AddrFrom16(k.Addr), port: port16(k.Port), proto: k.Proto}] = v
	})
	return out, err
}

func (codec6) putBe(m *ebpf.Map, keys []beKey, vals []netip.AddrPort, groups []*group) error {
	k, v := encodeSlots(keys, vals, groups, be6ValOf)
	return batchPut(m, k, v)
}

func (c codec6) readBe(m *ebpf.Map) (map[beKey]netip.AddrPort, error) {
	out := map[beKey]netip.AddrPort{}
	err := c.scanBe(m, func(k beKey, v netip.AddrPort) { out[k] = v })
	return out, err
}

func (codec6) scanBe(m *ebpf.Map, fn func(beKey, netip.AddrPort)) error {
	return readAll(m, func(k beKey, v be6Val) {
		fn(k, netip.AddrPortFrom(netip.AddrFrom16(v.Addr), port16(v.Port)))
	})
}

func (codec6) putNode(m *ebpf.Map, addrs []netip.Addr) error {
	return batchPut(m, convert(addrs, node6KeyOf), make([]uint8, len(addrs)))
}

func (codec6) delNode(m *ebpf.Map, addrs []netip.Addr) error {
	return batchDel(m, convert(addrs, node6KeyOf))
}

func (codec6) readNode(m *ebpf.Map) (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	err := readAll(m, func(k svc6Key, _ uint8) { out[netip.AddrFrom16(k.Addr)] = true })
	return out, err
}

// delBe removes backend slots; the key is the same for both families.
func delBe(m *ebpf.Map, keys []beKey) error { return batchDel(m, keys) }

// batchSize is how many entries one batch lookup returns.
const batchSize = 4096

// readAll calls fn with every entry of m, using batch lookups (kernel
// 5.6+ for hash maps).
func readAll[K comparable, V any](m *ebpf.Map, fn func(K, V)) error {
	keys := make([]K, batchSize)
	vals := make([]V, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", mapName(m), err)
		}
	}
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return m.String()
}

// MapFullError says that a BPF map is too small for the desired state.
// It names the map and the Config field that sizes it, and matches
// [proxier.ErrCapacity].
type MapFullError struct {
	// Map is the BPF map, e.g. "pk_be4".
	Map string
	// Field is the Config field that sets its size, e.g. "MaxBackends".
	Field string
	// Size is the map's size.
	Size int
}

// Error names the map, its size and the Config field that sets it.
func (e *MapFullError) Error() string {
	return fmt.Sprintf("BPF map %s is full (%d entries; raise Config.%s)", e.Map, e.Size, e.Field)
}

// Is matches [proxier.ErrCapacity].
func (e *MapFullError) Is(target error) bool { return target == proxier.ErrCapacity }

// configField returns the Config field that sizes the map name.
func configField(name string) string {
	switch name {
	case mapSvc4, mapSvc6, mapNSFe:
		return "MaxServices"
	case mapBe4, mapBe6, mapNSBe, mapNSLoc:
		return "MaxBackends"
	case mapAff4, mapAff6, mapNSAff:
		return "MaxAffinity"
	case mapRev, mapNSCt, mapNSRev:
		return "MaxSockets"
	case mapMag4, mapMag6, mapNSMag:
		return "MaxMaglevTables"
	}
	return "(fixed size)"
}

// parallelBatch is the least number of entries per writer when
// batchPut splits a batch: below it, a second thread costs more than it
// saves. maxWriters caps the writers of one batch.
const (
	parallelBatch = 1 << 15
	maxWriters    = 4
)

// batchPut writes keys and vals to m. A large batch (a full sync's
// endpoint slots) is split among up to GOMAXPROCS writers (at most
// maxWriters): the kernel updates a hash map under per-bucket locks,
// and its per-entry work (about 0.5 µs in a preallocated map of a
// million slots, most of a first sync at 100,000 services) runs in the
// writer's thread. The entries of one batch are written in no
// particular order (a key twice in a batch must have one value); a
// caller that needs an order writes batches in turn. An error names the
// map; a full map is a [*MapFullError].
func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	n := min(runtime.GOMAXPROCS(0), maxWriters, len(keys)/parallelBatch)
	if n <= 1 {
		if len(keys) == 0 {
			return nil
		}
		return batchUpdate(m, keys, vals)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		lo, hi := i*len(keys)/n, (i+1)*len(keys)/n
		wg.Go(func() { errs[i] = batchUpdate(m, keys[lo:hi], vals[lo:hi]) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// batchUpdate is batchPut for values of any slice type (one that
// marshals itself).
func batchUpdate(m *ebpf.Map, keys, vals any) error {
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		name := mapName(m)
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("update %s: %w", name, &MapFullError{Map: name, Field: configField(name), Size: int(m.MaxEntries())})
		}
		return fmt.Errorf("update %s: %w", name, err)
	}
	return nil
}

// batchDel removes keys from m; keys already gone are skipped.
func batchDel[K any](m *ebpf.Map, keys []K) error {
	for len(keys) > 0 {
		n, err := m.BatchDelete(keys, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) || n >= len(keys) {
			return fmt.Errorf("delete from %s: %w", mapName(m), err)
		}
		// The batch stopped at a missing key: skip it.
		keys = keys[n+1:]
	}
	return nil
}
