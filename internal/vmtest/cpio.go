package vmtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// archive is the content of an initramfs: paths without a leading slash,
// written as a newc cpio archive (the format the kernel unpacks). Parent
// directories are added implicitly.
type archive struct {
	entries map[string]*entry
}

type entry struct {
	mode uint32 // type and permission bits, as in stat(2)
	src  string // host file to copy (regular files)
	data []byte // content (regular files without src)
	link string // target (symlinks)
}

const (
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeLink = 0o120000
)

func newArchive() *archive { return &archive{entries: map[string]*entry{}} }

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

func (a *archive) add(p string, e *entry) {
	p = clean(p)
	if p == "" {
		return
	}
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := a.entries[d]; !ok {
			a.entries[d] = &entry{mode: modeDir | 0o755}
		}
	}
	a.entries[p] = e
}

// addDir adds a directory.
func (a *archive) addDir(p string, perm uint32) { a.add(p, &entry{mode: modeDir | perm}) }

// addBytes adds a regular file with the given content.
func (a *archive) addBytes(p string, data []byte, perm uint32) {
	a.add(p, &entry{mode: modeReg | perm, data: data})
}

// addFile adds a copy of the host file src (symlinks followed).
func (a *archive) addFile(p, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	a.add(p, &entry{mode: modeReg | uint32(st.Mode().Perm()), src: src})
	return nil
}

// addSymlink adds a symbolic link.
func (a *archive) addSymlink(p, target string) {
	a.add(p, &entry{mode: modeLink | 0o777, link: target})
}

// has reports whether the archive holds p.
func (a *archive) has(p string) bool { _, ok := a.entries[clean(p)]; return ok }

// write writes the archive in newc format, parents before children.
func (a *archive) write(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	// Sort by path components so that a directory precedes its content.
	slices.SortFunc(names, func(x, y string) int {
		return slices.Compare(strings.Split(x, "/"), strings.Split(y, "/"))
	})
	ino := uint32(1)
	for _, n := range names {
		e := a.entries[n]
		var size int64
		var body io.Reader
		switch e.mode &^ 0o7777 {
		case modeReg:
			if e.src != "" {
				st, err := os.Stat(e.src)
				if err != nil {
					return err
				}
				size = st.Size()
			} else {
				size, body = int64(len(e.data)), bytes.NewReader(e.data)
			}
		case modeLink:
			size, body = int64(len(e.link)), strings.NewReader(e.link)
		}
		if size > 0xffffffff {
			return fmt.Errorf("%s: too large for cpio", n)
		}
		if err := writeHeader(bw, n, ino, e.mode, uint32(size)); err != nil {
			return err
		}
		ino++
		if e.src != "" {
			if err := copyFile(bw, e.src, size); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		} else if body != nil {
			if _, err := io.Copy(bw, body); err != nil {
				return err
			}
		}
		if err := pad(bw, size); err != nil {
			return err
		}
	}
	if err := writeHeader(bw, "TRAILER!!!", 0, 0, 0); err != nil {
		return err
	}
	return bw.Flush()
}

const cpioHeaderLen = 110

func writeHeader(w *bufio.Writer, name string, ino, mode, size uint32) error {
	nlink := uint32(1)
	if mode&^0o7777 == modeDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check
	if _, err := fmt.Fprintf(w, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0); err != nil {
		return err
	}
	if _, err := w.WriteString(name + "\x00"); err != nil {
		return err
	}
	return pad(w, int64(cpioHeaderLen+len(name)+1))
}

func pad(w *bufio.Writer, n int64) error {
	if r := n % 4; r != 0 {
		_, err := w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}

// copyFile copies exactly size bytes of the host file src to w.
func copyFile(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if c != size {
		return errors.New("file shrank while being archived")
	}
	return nil
}
