package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/proxykit/proxykit/proxier"
)

// probe checks the program type, map types and helpers the socket
// programs use, so that a missing one is named. Loading the programs
// (which also needs the getpeername and recvmsg attach types, 5.8) is
// the final check.
func probe() error {
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return unsupported("cgroup sock_addr programs (kernel 4.17)", err)
	}
	for _, mt := range []struct {
		t    ebpf.MapType
		name string
	}{{ebpf.Hash, "hash maps"}, {ebpf.LRUHash, "LRU hash maps (kernel 4.10)"}} {
		if err := features.HaveMapType(mt.t); err != nil {
			return unsupported(mt.name, err)
		}
	}
	for _, h := range []struct {
		fn   asm.BuiltinFunc
		name string
	}{
		{asm.FnGetNetnsCookie, "bpf_get_netns_cookie (kernel 5.7)"},
		{asm.FnGetSocketCookie, "bpf_get_socket_cookie (kernel 4.12)"},
		{asm.FnSetRetval, "bpf_set_retval (kernel 5.18)"},
		{asm.FnGetPrandomU32, "bpf_get_prandom_u32"},
		{asm.FnKtimeGetNs, "bpf_ktime_get_ns"},
	} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h.fn); err != nil {
			return unsupported("helper "+h.name+" in cgroup sock_addr programs", err)
		}
	}
	return nil
}

// unsupported wraps the answer of a feature probe: ErrNotSupported
// becomes an [*proxier.UnsupportedError]; anything else (no privilege) stays
// what it is.
func unsupported(feature string, err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) {
		return &proxier.UnsupportedError{Backend: "ebpf", What: feature, Err: err}
	}
	return fmt.Errorf("ebpf: probe %s: %w", feature, err)
}
