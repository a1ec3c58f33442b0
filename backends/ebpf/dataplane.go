package ebpf

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/netns"
	"github.com/proxykit/proxykit/model"
	"github.com/proxykit/proxykit/proxier"
)

// hook is one cgroup attach point and its program.
type hook struct {
	name   string // section name, e.g. "connect4"
	attach ebpf.AttachType
	prog   func(*sockPrograms) *ebpf.Program
}

func hooks() []hook {
	return []hook{
		{"connect4", ebpf.AttachCGroupInet4Connect, func(p *sockPrograms) *ebpf.Program { return p.PkConnect4 }},
		{"connect6", ebpf.AttachCGroupInet6Connect, func(p *sockPrograms) *ebpf.Program { return p.PkConnect6 }},
		{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(p *sockPrograms) *ebpf.Program { return p.PkSendmsg4 }},
		{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(p *sockPrograms) *ebpf.Program { return p.PkSendmsg6 }},
		{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(p *sockPrograms) *ebpf.Program { return p.PkRecvmsg4 }},
		{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(p *sockPrograms) *ebpf.Program { return p.PkRecvmsg6 }},
		{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *sockPrograms) *ebpf.Program { return p.PkGetpeername4 }},
		{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *sockPrograms) *ebpf.Program { return p.PkGetpeername6 }},
	}
}

// linkPin is the file name of a hook's pinned link under PinPath.
func linkPin(h hook) string { return "pk_link_" + h.name }

// pinnedMaps are the maps pinned under PinPath.
func pinnedMaps() []string {
	return []string{mapSvc4, mapSvc6, mapBe4, mapBe6, mapAff4, mapAff6, mapRev, mapNetNS, mapNode4, mapNode6, mapMag4, mapMag6}
}

// dataplane is what both family backends of a proxier share: the loaded
// programs and maps, their attachment to the cgroup, the translated
// network namespaces and the UDP socket destroyer.
type dataplane struct {
	cfg     Config
	log     *slog.Logger
	objs    sockObjects
	destroy *destroyer // nil when the kernel cannot destroy sockets
	// nss are the translated namespaces: the node's first, then the
	// pods'. Guarded by mu once New has returned.
	nss      []nsEntry
	cgroupID uint64
	// repin are maps whose pin was incompatible with the configuration:
	// they were created afresh and replace the pin when attached.
	repin map[string]bool
	// metrics reports the maps' fill, for both family backends.
	metrics *mapMetrics
	// warned remembers the unknown schedulers of service ports logged
	// already, for both family backends.
	warned *schedulerWarnings

	mu       sync.Mutex
	refs     int
	families map[model.IPFamily]bool // acquired by a backend
	synced   map[model.IPFamily]bool // synced once since the last attach
	links    map[string]link.Link
	attached bool
	closed   bool
}

// destroyer is the UDP socket iterator of bpf/destroy.c.
type destroyer struct {
	objs destroyObjects
	iter *link.Iter
}

// newDataplane checks the configuration, probes the kernel and loads the
// programs. It holds one reference, dropped with release.
func newDataplane(cfg Config) (*dataplane, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := checkFS(cfg.CgroupPath, unix.CGROUP2_SUPER_MAGIC, "cgroup v2 directory"); err != nil {
		return nil, err
	}
	if cfg.PinPath != "" {
		if err := checkFS(cfg.PinPath, unix.BPF_FS_MAGIC, "bpffs directory"); err != nil {
			return nil, err
		}
	}
	if err := probe(); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(cfg.CgroupPath, &st); err != nil {
		return nil, fmt.Errorf("ebpf: cgroup %s: %w", cfg.CgroupPath, err)
	}
	metrics, err := newMapMetrics(cfg.Config)
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	d := &dataplane{
		cfg:      cfg,
		log:      cfg.Logger.With("backend", "ebpf"),
		cgroupID: st.Ino,
		repin:    map[string]bool{},
		warned:   newSchedulerWarnings(),
		metrics:  metrics,
		refs:     1,
		families: map[model.IPFamily]bool{},
		synced:   map[model.IPFamily]bool{},
		links:    map[string]link.Link{},
	}
	if err := d.openNamespaces(); err != nil {
		d.closeAll()
		return nil, err
	}
	if err := d.load(); err != nil {
		d.closeAll()
		return nil, err
	}
	return d, nil
}

// nsEntry is a translated network namespace: the path it was named by,
// the open handle and its cookie.
type nsEntry struct {
	path   string
	ns     *netns.NS
	cookie uint64
}

// openNamespaces opens the node's and the pods' namespaces and reads
// their cookies. A namespace named twice is kept once.
func (d *dataplane) openNamespaces() error {
	for _, p := range append([]string{d.cfg.NetNS}, d.cfg.PodNetNS...) {
		e, err := openNetNS(p)
		if err != nil {
			return err
		}
		if d.hasNetNS(e.cookie) {
			e.ns.Close()
			continue
		}
		d.nss = append(d.nss, e)
	}
	return nil
}

// openNetNS opens the namespace path and reads its cookie.
func openNetNS(path string) (nsEntry, error) {
	ns, err := netns.Open(path)
	if err != nil {
		return nsEntry{}, fmt.Errorf("ebpf: %w", err)
	}
	c, err := netnsCookie(ns)
	if err != nil {
		ns.Close()
		return nsEntry{}, fmt.Errorf("ebpf: cookie of network namespace %q: %w", path, err)
	}
	return nsEntry{path: path, ns: ns, cookie: c}, nil
}

func (d *dataplane) hasNetNS(cookie uint64) bool {
	return slices.ContainsFunc(d.nss, func(e nsEntry) bool { return e.cookie == cookie })
}

// addPodNetNS starts translating the sockets of the namespace path (and
// searching it for UDP sockets of removed endpoints). Adding a
// namespace that is translated already does nothing.
func (d *dataplane) addPodNetNS(path string) error {
	e, err := openNetNS(path)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		e.ns.Close()
		return errClosed
	}
	if d.hasNetNS(e.cookie) {
		e.ns.Close()
		return nil
	}
	if err := batchPut(d.objs.PkNetns, []uint64{e.cookie}, []uint8{0}); err != nil {
		e.ns.Close()
		return fmt.Errorf("ebpf: %w", err)
	}
	d.nss = append(d.nss, e)
	d.log.Debug("pod network namespace added", "path", path, "cookie", e.cookie)
	return nil
}

// removePodNetNS stops translating the sockets of a pod namespace added
// by path (with PodNetNS or addPodNetNS), found by its cookie while the
// path still names a namespace, else by the path itself. Removing a
// namespace that is not translated does nothing; the node's namespace
// cannot be removed.
func (d *dataplane) removePodNetNS(path string) error {
	var cookie uint64
	if e, err := openNetNS(path); err == nil {
		cookie = e.cookie
		e.ns.Close()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed
	}
	i := slices.IndexFunc(d.nss, func(e nsEntry) bool { return cookie != 0 && e.cookie == cookie })
	if i < 0 {
		i = slices.IndexFunc(d.nss, func(e nsEntry) bool { return e.path == path })
	}
	switch {
	case i < 0:
		return nil
	case i == 0:
		return fmt.Errorf("ebpf: %q is the node's network namespace, not a pod's", path)
	}
	e := d.nss[i]
	if err := batchDel(d.objs.PkNetns, []uint64{e.cookie}); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	d.nss = slices.Delete(d.nss, i, i+1)
	d.log.Debug("pod network namespace removed", "path", path, "cookie", e.cookie)
	return e.ns.Close()
}

// netnsCookie returns the cookie of a network namespace (kernel 5.14+:
// SO_NETNS_COOKIE), what bpf_get_netns_cookie returns for its sockets.
func netnsCookie(ns *netns.NS) (uint64, error) {
	var cookie uint64
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		size := uint32(unsafe.Sizeof(cookie))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE,
			uintptr(unsafe.Pointer(&cookie)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			return &proxier.UnsupportedError{Backend: "ebpf", What: "SO_NETNS_COOKIE (kernel 5.14)", Err: errno}
		}
		return nil
	})
	return cookie, err
}

// load loads the socket programs and maps (adopting pinned maps) and the
// UDP socket destroyer.
func (d *dataplane) load() error {
	spec, err := loadSock()
	if err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	set := func(name string, v uint8) error {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("ebpf: object lacks variable %s", name)
		}
		return vs.Set(v)
	}
	var all, passthrough uint8
	if d.cfg.AllNetNS {
		all = 1
	}
	if !d.cfg.SocketOnly {
		passthrough = 1
	}
	if err := errors.Join(set("all_netns", all), set("udp_connect_passthrough", passthrough)); err != nil {
		return err
	}
	// With north-south at tc no program sees the node's own packets, so
	// its UDP sockets are refused at connect as in socket-only mode; the
	// composed nftables table rejects them itself.
	var node uint64
	if d.cfg.NorthSouth == NorthSouthTC || d.cfg.NorthSouth == NorthSouthXDP {
		node = d.nss[0].cookie
	}
	if vs, ok := spec.Variables["node_netns"]; !ok {
		return errors.New("ebpf: object lacks variable node_netns")
	} else if err := vs.Set(node); err != nil {
		return err
	}
	if vs, ok := spec.Variables["maglev_size"]; !ok {
		return errors.New("ebpf: object lacks variable maglev_size")
	} else if err := vs.Set(uint32(d.cfg.MaglevTableSize)); err != nil {
		return err
	}
	// The per-family maps are preallocated, and can be large: those of
	// a family that is not configured get one entry, unless a map of
	// that name is pinned already (another proxier, configured for
	// that family, shares the pins: its map is adopted as it is). The
	// Maglev maps exist with random selection too, for the service
	// ports whose Scheduler asks for Maglev (MaxMaglevTables then
	// defaults to a small size). (Sized by the configuration, not by
	// the backends created, so that two NewBackend calls with one
	// Config and PinPath agree.)
	other := map[string]bool{}
	per := func(f model.IPFamily, n int) int {
		if slices.Contains(d.cfg.Families, f) {
			return n
		}
		return 1
	}
	for _, f := range []model.IPFamily{model.IPv4, model.IPv6} {
		if !slices.Contains(d.cfg.Families, f) {
			for _, name := range familyMapNames(f) {
				other[name] = true
			}
		}
	}
	sizes := map[string]int{
		mapSvc4: per(model.IPv4, d.cfg.MaxServices), mapSvc6: per(model.IPv6, d.cfg.MaxServices),
		mapBe4: per(model.IPv4, d.cfg.MaxBackends), mapBe6: per(model.IPv6, d.cfg.MaxBackends),
		mapAff4: per(model.IPv4, d.cfg.MaxAffinity), mapAff6: per(model.IPv6, d.cfg.MaxAffinity),
		mapMag4: per(model.IPv4, d.cfg.MaxMaglevTables), mapMag6: per(model.IPv6, d.cfg.MaxMaglevTables),
		mapRev: d.cfg.MaxSockets,
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	for _, name := range []string{mapMag4, mapMag6} {
		if err := sizeTableMap(spec.Maps[name], d.cfg.MaglevTableSize); err != nil {
			return err
		}
	}
	for name, ms := range spec.Maps {
		if d.cfg.PinPath == "" {
			ms.Pinning = ebpf.PinNone
			continue
		}
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		if err := d.checkPin(name, ms, other[name]); err != nil {
			return err
		}
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinPath}}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		return loadError("the socket programs", err)
	}
	d.destroy, err = loadDestroyer(d.objs.PkRev)
	if err != nil {
		d.log.Warn("connected UDP sockets of removed endpoints will not be destroyed (needs kernel 6.5+ bpf_sock_destroy and BTF)", "err", err)
	}
	return nil
}

// familyMapNames returns the names of the maps of family f that are
// sized by the configuration.
func familyMapNames(f model.IPFamily) []string {
	if f == model.IPv6 {
		return []string{mapSvc6, mapBe6, mapAff6, mapMag6}
	}
	return []string{mapSvc4, mapBe4, mapAff4, mapMag4}
}

// sizeTableMap makes the Maglev map ms hold rows of m entries: its value
// size and the array length of its BTF value type.
func sizeTableMap(ms *ebpf.MapSpec, m int) error {
	arr, ok := ms.Value.(*btf.Array)
	if !ok {
		return fmt.Errorf("ebpf: map %s: value type %v is no array", ms.Name, ms.Value)
	}
	resized := *arr
	resized.Nelems = uint32(m)
	ms.Value = &resized
	ms.ValueSize = uint32(4 * m)
	return nil
}

// checkPin looks at the pinned map name, if any: when it does not match
// ms (the configuration changed its size), ms is created afresh and
// replaces the pin when the programs are attached. With anySize (a map
// of a family this configuration leaves out), a pinned map of any size
// is adopted: the proxier that owns the family sized it.
func (d *dataplane) checkPin(name string, ms *ebpf.MapSpec, anySize bool) error {
	path := filepath.Join(d.cfg.PinPath, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ebpf: pinned map %s: %w", path, err)
	}
	defer m.Close()
	if anySize {
		ms.MaxEntries = m.MaxEntries()
	}
	if cerr := ms.Compatible(m); cerr != nil {
		if m.MaxEntries() == 1 && ms.MaxEntries > 1 {
			// The one-entry map a proxier configured without this
			// family left: nothing is lost.
			d.log.Debug("pinned placeholder map replaced", "map", path)
			ms.Pinning = ebpf.PinNone
			d.repin[name] = true
			return nil
		}
		d.log.Warn("pinned map does not match the configuration; it is replaced at the first sync and its contents are lost", "map", path, "err", cerr)
		ms.Pinning = ebpf.PinNone
		d.repin[name] = true
	}
	return nil
}

func loadDestroyer(rev *ebpf.Map) (*destroyer, error) {
	spec, err := loadDestroy()
	if err != nil {
		return nil, err
	}
	for _, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
	}
	spec.Maps[mapRev].MaxEntries = rev.MaxEntries()
	var x destroyer
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{mapRev: rev}}
	if err := spec.LoadAndAssign(&x.objs, opts); err != nil {
		return nil, loadError("the UDP socket iterator", err)
	}
	if x.iter, err = link.AttachIter(link.IterOptions{Program: x.objs.PkDestroyUdp}); err != nil {
		x.objs.Close()
		return nil, &proxier.UnsupportedError{Backend: "ebpf", What: "BPF UDP socket iterators (kernel 5.9)", Err: err}
	}
	return &x, nil
}

// loadError classifies a failure to load what.
func loadError(what string, err error) error {
	var verr *ebpf.VerifierError
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("ebpf: load %s: %w (CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN, are needed)", what, err)
	case errors.As(err, &verr), errors.Is(err, unix.EINVAL), errors.Is(err, ebpf.ErrNotSupported):
		return &proxier.UnsupportedError{Backend: "ebpf", What: "what " + what + " need", Err: err}
	}
	return fmt.Errorf("ebpf: load %s: %w", what, err)
}

// familyMaps returns the frontend, slot, node address and Maglev table
// maps of f.
func (d *dataplane) familyMaps(f model.IPFamily) (svc, be, node, mag *ebpf.Map) {
	if f == model.IPv6 {
		return d.objs.PkSvc6, d.objs.PkBe6, d.objs.PkNode6, d.objs.PkMaglev6
	}
	return d.objs.PkSvc4, d.objs.PkBe4, d.objs.PkNode4, d.objs.PkMaglev4
}

// acquire registers a backend of family f.
func (d *dataplane) acquire(f model.IPFamily) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refs++
	d.families[f] = true
}

// release drops a reference; the last one closes everything.
func (d *dataplane) release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refs--
	if d.refs > 0 {
		return nil
	}
	return d.closeAll()
}

// closeAll closes links (unpinned ones detach), objects and namespaces.
func (d *dataplane) closeAll() error {
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	for _, h := range hooks() {
		if l := d.links[h.name]; l != nil {
			errs = append(errs, l.Close())
		}
	}
	d.links = nil
	if d.destroy != nil {
		errs = append(errs, d.destroy.iter.Close(), d.destroy.objs.Close())
	}
	errs = append(errs, d.objs.Close())
	for _, e := range d.nss {
		errs = append(errs, e.ns.Close())
	}
	return errors.Join(errs...)
}

// syncNetNS makes pk_netns hold exactly the translated namespaces.
func (d *dataplane) syncNetNS() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncNetNSLocked()
}

func (d *dataplane) syncNetNSLocked() error {
	m := d.objs.PkNetns
	have := map[uint64]bool{}
	if err := readAll(m, func(k uint64, _ uint8) { have[k] = true }); err != nil {
		return err
	}
	var add, del []uint64
	for _, e := range d.nss {
		c := e.cookie
		if !have[c] {
			add = append(add, c)
		}
		delete(have, c)
	}
	for c := range have {
		del = append(del, c)
	}
	return errors.Join(batchPut(m, add, make([]uint8, len(add))), batchDel(m, del))
}

// markSynced records that the backend of f synced. Once every backend has,
// the programs are attached (or replace those of a pinned link).
func (d *dataplane) markSynced(f model.IPFamily) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.synced[f] = true
	if d.attached {
		return nil
	}
	for fam := range d.families {
		if !d.synced[fam] {
			return nil
		}
	}
	return d.attachLocked()
}

// attachLocked attaches every program to the cgroup, or replaces the
// program of a pinned link (adopting a predecessor's attachment without
// a gap), and pins maps and links.
func (d *dataplane) attachLocked() error {
	if err := d.syncNetNSLocked(); err != nil {
		return err
	}
	if d.cfg.PinPath != "" {
		if err := d.pinMaps(); err != nil {
			return err
		}
	}
	for _, h := range hooks() {
		if err := d.attachHook(h); err != nil {
			return fmt.Errorf("ebpf: attach %s to %s: %w", h.name, d.cfg.CgroupPath, err)
		}
	}
	d.attached = true
	d.log.Info("programs attached", "cgroup", d.cfg.CgroupPath, "pinned", d.cfg.PinPath != "", "namespaces", len(d.nss), "all", d.cfg.AllNetNS)
	return nil
}

// pinMaps pins the maps not pinned yet (after Cleanup, or those
// replaced because their configuration changed).
func (d *dataplane) pinMaps() error {
	maps := map[string]*ebpf.Map{
		mapSvc4: d.objs.PkSvc4, mapSvc6: d.objs.PkSvc6, mapBe4: d.objs.PkBe4, mapBe6: d.objs.PkBe6,
		mapAff4: d.objs.PkAff4, mapAff6: d.objs.PkAff6, mapRev: d.objs.PkRev, mapNetNS: d.objs.PkNetns,
		mapNode4: d.objs.PkNode4, mapNode6: d.objs.PkNode6, mapMag4: d.objs.PkMaglev4, mapMag6: d.objs.PkMaglev6,
	}
	for _, name := range pinnedMaps() {
		m := maps[name]
		if m.IsPinned() {
			continue
		}
		path := filepath.Join(d.cfg.PinPath, name)
		if d.repin[name] {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("ebpf: replace pinned map: %w", err)
			}
		}
		if err := m.Pin(path); err != nil {
			return fmt.Errorf("ebpf: pin map: %w", err)
		}
		delete(d.repin, name)
	}
	return nil
}

func (d *dataplane) attachHook(h hook) error {
	prog := h.prog(&d.objs.sockPrograms)
	if l := d.links[h.name]; l != nil {
		return l.Update(prog)
	}
	var pin string
	var old link.Link
	if d.cfg.PinPath != "" {
		pin = filepath.Join(d.cfg.PinPath, linkPin(h))
		l, err := link.LoadPinnedLink(pin, nil)
		switch {
		case err == nil && d.linkOnCgroup(l):
			// A predecessor's attachment: swap the program in place.
			if err := l.Update(prog); err != nil {
				l.Close()
				return err
			}
			d.links[h.name] = l
			return nil
		case err == nil:
			old = l // attached elsewhere: replaced below
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("load pinned link: %w", err)
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: d.cfg.CgroupPath, Attach: h.attach, Program: prog})
	if err != nil {
		if old != nil {
			old.Close()
		}
		return err
	}
	if old != nil {
		// Attach the new program before the old one goes: no gap.
		errs := errors.Join(old.Unpin(), old.Detach(), old.Close())
		if errs != nil {
			d.log.Warn("detach link of another cgroup", "hook", h.name, "err", errs)
		}
	}
	if pin != "" {
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin link: %w", err)
		}
	}
	d.links[h.name] = l
	return nil
}

// linkOnCgroup reports whether l is attached to the configured cgroup.
func (d *dataplane) linkOnCgroup(l link.Link) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == d.cgroupID
}

// cleanup detaches every program (ours, or a predecessor's pinned
// links) and removes every pin. It is idempotent.
func (d *dataplane) cleanup() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed
	}
	var errs []error
	for _, h := range hooks() {
		l := d.links[h.name]
		delete(d.links, h.name)
		if l == nil && d.cfg.PinPath != "" {
			var err error
			l, err = link.LoadPinnedLink(filepath.Join(d.cfg.PinPath, linkPin(h)), nil)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("ebpf: load pinned link %s: %w", h.name, err))
				continue
			}
		}
		if l == nil {
			continue
		}
		if d.cfg.PinPath != "" {
			if err := l.Unpin(); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("ebpf: unpin link %s: %w", h.name, err))
			}
		}
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("ebpf: detach %s: %w", h.name, err))
		}
		errs = append(errs, l.Close())
	}
	d.attached = false
	clear(d.synced)
	if d.cfg.PinPath != "" {
		for _, m := range []*ebpf.Map{d.objs.PkSvc4, d.objs.PkSvc6, d.objs.PkBe4, d.objs.PkBe6, d.objs.PkAff4,
			d.objs.PkAff6, d.objs.PkRev, d.objs.PkNetns, d.objs.PkNode4, d.objs.PkNode6, d.objs.PkMaglev4, d.objs.PkMaglev6} {
			if m.IsPinned() {
				if err := m.Unpin(); err != nil {
					errs = append(errs, fmt.Errorf("ebpf: unpin map: %w", err))
				}
			}
		}
		// Pins this process did not adopt (their configuration differed).
		for _, name := range pinnedMaps() {
			if err := os.Remove(filepath.Join(d.cfg.PinPath, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("ebpf: unpin map %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// destroyStale destroys the connected UDP sockets of the translated
// namespaces that were translated to an endpoint that left the service
// they were sent to. It does nothing when the kernel cannot destroy
// sockets.
func (d *dataplane) destroyStale(pairs []staleKey) error {
	if d.destroy == nil || len(pairs) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.destroy.objs.PkStale
	pairs = slices.Clone(pairs)
	if len(pairs) > int(m.MaxEntries()) {
		pairs = pairs[:m.MaxEntries()]
	}
	if err := batchPut(m, pairs, make([]uint8, len(pairs))); err != nil {
		return err
	}
	defer batchDel(m, pairs)
	var errs []error
	for _, e := range d.nss {
		errs = append(errs, e.ns.Do(func() error {
			r, err := d.destroy.iter.Open()
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = io.Copy(io.Discard, r)
			return err
		}))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: destroy UDP sockets: %w", err)
	}
	return nil
}
