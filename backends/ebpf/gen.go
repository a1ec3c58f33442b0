package ebpf

// The BPF objects are built from bpf/*.c with Debian's clang-19 and
// committed, so neither users nor CI need clang. Only little-endian
// objects (bpfel) are built; the package does not build on big-endian
// architectures. Regenerate with: go generate ./backends/ebpf/...

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -mcpu=v3 -Wall -Werror -Ibpf/include" sock bpf/sock.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -mcpu=v3 -Wall -Werror -Ibpf/include" destroy bpf/destroy.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -mcpu=v3 -Wall -Werror -Ibpf/include" nodeport bpf/nodeport.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -mcpu=v3 -Wall -Werror -Ibpf/include" xdp bpf/xdp.c
