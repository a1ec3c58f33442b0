package main

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine describes where a run ran.
type Machine struct {
	CPU       string  `json:"cpu"`
	CPUs      int     `json:"cpus"`
	MemoryGB  float64 `json:"memory_gb"`
	Kernel    string  `json:"kernel"`
	OS        string  `json:"os"`
	Go        string  `json:"go"`
	NFT       string  `json:"nft"`
	IPTables  string  `json:"iptables"`
	LoadStart string  `json:"load_start"`
	LoadEnd   string  `json:"load_end"`
	Source    string  `json:"source,omitempty"`
	Note      string  `json:"note,omitempty"`
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAvg()}
	m.CPU = cpuModel()
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryGB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	m.OS = osRelease()
	m.NFT = command("nft", "--version")
	m.IPTables = command("iptables", "--version")
	m.Source = command("git", "describe", "--always", "--dirty")
	return m
}

// cpuModel is the CPU's name from /proc/cpuinfo, with its family and
// model numbers, and whether it runs under a hypervisor.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			if len(fields) > 0 {
				break // the first processor is enough
			}
			continue
		}
		fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	s := fields["model name"]
	if fam, mod := fields["cpu family"], fields["model"]; fam != "" {
		s += " (family " + fam + ", model " + mod + ")"
	}
	if strings.Contains(" "+fields["flags"]+" ", " hypervisor ") {
		s += ", virtual machine"
	}
	return s
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func osRelease() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "PRETTY_NAME="); ok {
			if u, err := strconv.Unquote(v); err == nil {
				return u
			}
			return v
		}
	}
	return ""
}

func command(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// hostIPTablesFlavour is the flavour the host's iptables command uses,
// "nft" or "legacy"; "" without iptables.
func hostIPTablesFlavour() string {
	v := command("iptables", "--version")
	switch {
	case v == "":
		return ""
	case strings.Contains(v, "legacy"):
		return "legacy"
	case strings.Contains(v, "nf_tables"):
		return "nft"
	}
	return "legacy" // before 1.8 there was only legacy
}
