package testnet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// waitNoLeaks polls leaks until it reports nothing or max has passed
// (a socket closed by another goroutine is released a moment later), and
// returns the last report.
func waitNoLeaks(inos map[uint64]string, max time.Duration) []string {
	deadline := time.Now().Add(max)
	for {
		l := leaks(inos)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaks lists what of this process still refers to one of the given
// network namespaces (inode number -> name): open namespace files, sockets
// living in them (found with SIOCGSKNS) and threads inside them. Each of
// those keeps a torn-down namespace alive.
func leaks(inos map[uint64]string) []string {
	var out []string
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := nsInode(link); ok {
			if name, ok := inos[ino]; ok {
				out = append(out, fmt.Sprintf("fd %s is namespace %s", e.Name(), name))
			}
			continue
		}
		if !strings.HasPrefix(link, "socket:[") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// The fd may have been closed and reused meanwhile; then the
		// answer is about another socket or an error, both harmless.
		nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(nsfd, &st)
		unix.Close(nsfd)
		if err != nil {
			continue
		}
		if name, ok := inos[st.Ino]; ok {
			out = append(out, fmt.Sprintf("fd %s is a socket in namespace %s", e.Name(), name))
		}
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, e := range tasks {
		link, err := os.Readlink(filepath.Join("/proc/self/task", e.Name(), "ns/net"))
		if err != nil {
			continue
		}
		if ino, ok := nsInode(link); ok {
			if name, ok := inos[ino]; ok {
				out = append(out, fmt.Sprintf("thread %s is in namespace %s", e.Name(), name))
			}
		}
	}
	return out
}

// nsInode parses "net:[4026532123]".
func nsInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "net:[")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
	return ino, err == nil
}
