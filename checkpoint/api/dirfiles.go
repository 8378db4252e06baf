package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
)

// DirFiles is Files over a directory of this machine per sandbox
// (Root/ID), resolved inside it with os.Root: the file system of the unit
// tests' backends (here and in the SDKs'), where there is no guest.
type DirFiles struct {
	Root string
	mu   sync.Mutex
}

func (d *DirFiles) open(id string) (*os.Root, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dir := filepath.Join(d.Root, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.OpenRoot(dir)
}

// rel is path (absolute) relative to the root.
func rel(path string) string {
	p := strings.TrimLeft(filepath.Clean(path), "/")
	if p == "" {
		return "."
	}
	return p
}

// dirErr classes an os error as the guest agent's would be.
func dirErr(err error, what string) error {
	var errno syscall.Errno
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrAlreadyExists)
	case errors.As(err, &errno) && errno == syscall.ENOTEMPTY:
		return fmt.Errorf("%s: the directory is not empty (remove it recursively): %w", what, errdefs.ErrFailedPrecondition)
	case errors.As(err, &errno) && (errno == syscall.EISDIR || errno == syscall.ENOTDIR):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func infoOf(dir, name string, fi fs.FileInfo, target string) FileInfo {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "symlink"
	}
	return FileInfo{Name: name, Path: joinPath(dir, name), Type: t, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime().UTC(), Target: target}
}

// ReadFile implements Files.
func (d *DirFiles) ReadFile(ctx context.Context, id, path string, offset int64, length int) (FileChunk, error) {
	r, err := d.open(id)
	if err != nil {
		return FileChunk{}, err
	}
	defer r.Close()
	f, err := r.Open(rel(path))
	if err != nil {
		return FileChunk{}, dirErr(err, "read "+path)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileChunk{}, dirErr(err, "read "+path)
	}
	if st.IsDir() {
		return FileChunk{}, fmt.Errorf("read %s: is a directory: %w", path, errdefs.ErrInvalidArgument)
	}
	if length <= 0 || length > MaxFileChunk {
		length = MaxFileChunk
	}
	buf := make([]byte, length)
	n, err := f.ReadAt(buf, offset)
	if err != nil && err != io.EOF {
		return FileChunk{}, dirErr(err, "read "+path)
	}
	return FileChunk{Data: buf[:n], EOF: offset+int64(n) >= st.Size(), Size: st.Size()}, nil
}

// WriteFile implements Files.
func (d *DirFiles) WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode, appending bool) (int64, error) {
	if len(data) > MaxFileChunk {
		return 0, fmt.Errorf("write %s: %d bytes, more than %d: %w", path, len(data), MaxFileChunk, errdefs.ErrInvalidArgument)
	}
	r, err := d.open(id)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	if dir := filepath.Dir(rel(path)); dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return 0, dirErr(err, "write "+path)
		}
	}
	if mode == 0 {
		mode = 0o644
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appending {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := r.OpenFile(rel(path), flags, mode)
	if err != nil {
		return 0, dirErr(err, "write "+path)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return 0, dirErr(err, "write "+path)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Stat implements Files.
func (d *DirFiles) Stat(ctx context.Context, id, path string) (FileInfo, error) {
	r, err := d.open(id)
	if err != nil {
		return FileInfo{}, err
	}
	defer r.Close()
	fi, err := r.Lstat(rel(path))
	if err != nil {
		return FileInfo{}, dirErr(err, "stat "+path)
	}
	target := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = r.Readlink(rel(path))
	}
	out := infoOf("/", filepath.Base(path), fi, target)
	out.Path = path
	return out, nil
}

// ListDir implements Files.
func (d *DirFiles) ListDir(ctx context.Context, id, path, after string, limit int) ([]FileInfo, bool, error) {
	r, err := d.open(id)
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	f, err := r.Open(rel(path))
	if err != nil {
		return nil, false, dirErr(err, "list "+path)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, false, dirErr(err, "list "+path)
	}
	sort.Strings(names)
	var out []FileInfo
	for _, n := range names {
		if n <= after {
			continue
		}
		if len(out) == limit {
			return out, true, nil
		}
		p := filepath.Join(rel(path), n)
		fi, err := r.Lstat(p)
		if err != nil {
			continue
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ = r.Readlink(p)
		}
		out = append(out, infoOf(path, n, fi, target))
	}
	return out, false, nil
}

// Remove implements Files.
func (d *DirFiles) Remove(ctx context.Context, id, path string, recursive bool) error {
	if rel(path) == "." {
		return fmt.Errorf("remove %s: names no file in a directory: %w", path, errdefs.ErrInvalidArgument)
	}
	r, err := d.open(id)
	if err != nil {
		return err
	}
	defer r.Close()
	if _, err := r.Lstat(rel(path)); err != nil {
		return dirErr(err, "remove "+path)
	}
	if recursive {
		return dirErr(r.RemoveAll(rel(path)), "remove "+path)
	}
	return dirErr(r.Remove(rel(path)), "remove "+path)
}

// MakeDir implements Files.
func (d *DirFiles) MakeDir(ctx context.Context, id, path string, mode fs.FileMode) (bool, error) {
	r, err := d.open(id)
	if err != nil {
		return false, err
	}
	defer r.Close()
	if fi, err := r.Lstat(rel(path)); err == nil {
		if fi.IsDir() {
			return false, nil
		}
		return false, fmt.Errorf("make directory %s: a file is there: %w", path, errdefs.ErrAlreadyExists)
	}
	if mode == 0 {
		mode = 0o755
	}
	if err := r.MkdirAll(rel(path), mode); err != nil {
		return false, dirErr(err, "make directory "+path)
	}
	return true, nil
}
