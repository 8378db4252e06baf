package guestimage

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"
)

// Initramfs collects files for a newc cpio archive (the format the kernel unpacks). Entries are written sorted
// by path with fixed timestamps and owners, so the same inputs give byte-identical archives.
type Initramfs struct {
	entries map[string]entry
}

type entry struct {
	mode cpio.FileMode
	data []byte // regular files
	src  string // regular files read from the host at write time
	link string // symlinks
}

// NewInitramfs returns an empty archive description.
func NewInitramfs() *Initramfs { return &Initramfs{entries: map[string]entry{}} }

func clean(p string) (string, error) {
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" {
		return "", fmt.Errorf("initramfs: empty path %q", p)
	}
	return c, nil
}

// addParents creates every missing parent directory of p.
func (r *Initramfs) addParents(p string) {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := r.entries[d]; !ok {
			r.entries[d] = entry{mode: cpio.TypeDir | 0o755}
		}
	}
}

// Dir adds a directory.
func (r *Initramfs) Dir(p string, perm os.FileMode) error {
	c, err := clean(p)
	if err != nil {
		return err
	}
	r.addParents(c)
	r.entries[c] = entry{mode: cpio.TypeDir | cpio.FileMode(perm.Perm())}
	return nil
}

// Bytes adds a regular file with the given contents.
func (r *Initramfs) Bytes(p string, data []byte, perm os.FileMode) error {
	c, err := clean(p)
	if err != nil {
		return err
	}
	r.addParents(c)
	r.entries[c] = entry{mode: cpio.TypeReg | cpio.FileMode(perm.Perm()), data: data}
	return nil
}

// File adds the host file src at p, keeping its permission bits.
func (r *Initramfs) File(p, src string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("initramfs: %s is not a regular file", src)
	}
	c, err := clean(p)
	if err != nil {
		return err
	}
	r.addParents(c)
	r.entries[c] = entry{mode: cpio.TypeReg | cpio.FileMode(st.Mode().Perm()), src: src}
	return nil
}

// Program adds the host program src at p together with the shared libraries it needs, at their host paths
// (so its ELF interpreter resolves the same way inside).
func (r *Initramfs) Program(p, src string) error {
	if err := r.File(p, src); err != nil {
		return err
	}
	libs, err := SharedLibs(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	for _, l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		if err := r.File(l, real); err != nil {
			return err
		}
	}
	return nil
}

// Symlink adds a symbolic link p -> target.
func (r *Initramfs) Symlink(p, target string) error {
	c, err := clean(p)
	if err != nil {
		return err
	}
	r.addParents(c)
	r.entries[c] = entry{mode: cpio.TypeSymlink | 0o777, link: target}
	return nil
}

// WriteTo writes the archive, gzip-compressed when compress is set.
func (r *Initramfs) WriteTo(w io.Writer, compress bool) error {
	out := w
	var gz *gzip.Writer
	if compress {
		gz = gzip.NewWriter(w)
		out = gz
	}
	cw := cpio.NewWriter(out)
	names := make([]string, 0, len(r.entries))
	for n := range r.entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before children
	for i, n := range names {
		e := r.entries[n]
		data := e.data
		if e.src != "" {
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
		}
		if e.link != "" {
			data = []byte(e.link)
		}
		h := &cpio.Header{Name: n, Mode: e.mode, Size: int64(len(data)), Links: 1, ModTime: time.Unix(0, 0), Inode: int64(i + 1)}
		if e.mode&cpio.TypeDir == cpio.TypeDir && e.mode&^cpio.ModePerm == cpio.TypeDir {
			h.Links = 2
		}
		if err := cw.WriteHeader(h); err != nil {
			return fmt.Errorf("initramfs %s: %w", n, err)
		}
		if _, err := cw.Write(data); err != nil {
			return fmt.Errorf("initramfs %s: %w", n, err)
		}
	}
	if err := cw.Close(); err != nil {
		return err
	}
	if gz != nil {
		return gz.Close()
	}
	return nil
}
