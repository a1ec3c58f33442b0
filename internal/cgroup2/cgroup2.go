package cgroup2

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Mount returns where the cgroup v2 file system is mounted.
func Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mount point (field 5) ... " - " fstype ...
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if fs := strings.Fields(pre); len(fs) >= 5 {
			return fs[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 file system is mounted")
}

// Own returns the cgroup v2 directory of this process, under mount.
func Own(mount string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return filepath.Join(mount, p), nil
		}
	}
	return "", errors.New("this process has no cgroup v2 membership")
}

// Create makes an empty cgroup directly under the cgroup v2 mount, named
// prefix followed by random hex digits, and returns its directory. The
// caller removes it (os.Remove) once no process is left in it.
func Create(prefix string) (string, error) {
	mount, err := Mount()
	if err != nil {
		return "", err
	}
	var id [4]byte
	rand.Read(id[:])
	dir := filepath.Join(mount, prefix+hex.EncodeToString(id[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// Enter makes a cgroup like [Create] and moves this whole process into
// it, so that the sockets it opens from then on, in any network
// namespace, belong to that cgroup. leave moves the process back to the
// cgroup it came from and removes the one made.
func Enter(prefix string) (dir string, leave func() error, err error) {
	mount, err := Mount()
	if err != nil {
		return "", nil, err
	}
	orig, err := Own(mount)
	if err != nil {
		return "", nil, err
	}
	if dir, err = Create(prefix); err != nil {
		return "", nil, err
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("move the process into %s: %w", dir, err)
	}
	leave = func() error {
		if err := os.WriteFile(filepath.Join(orig, "cgroup.procs"), pid, 0); err != nil {
			return fmt.Errorf("move the process back to %s: %w", orig, err)
		}
		return os.Remove(dir)
	}
	return dir, leave, nil
}
