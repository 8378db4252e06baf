// Package imagefile creates, clones and inspects the ext4 image files that back
// cube-snapshotter's snapshots. It knows nothing about containerd metadata:
// callers decide names and lifetimes.
package imagefile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Mode says how a child image gets its parent's contents.
type Mode string

const (
	// ModeReflink shares the parent's extents (FICLONE); O(metadata) time and space.
	ModeReflink Mode = "reflink"
	// ModeCopy copies the parent's allocated ranges; O(data) time and space.
	ModeCopy Mode = "copy"
)

// MinSize is the smallest image we create: mkfs.ext4 needs room for the
// journal and group descriptors, and smaller filesystems are useless as rootfs.
const MinSize int64 = 16 << 20

// MaxSize bounds sizes taken from labels and config (16 TiB, ext4 with 4 KiB blocks
// and no 64bit feature tops out there; beyond it mkfs behaviour changes).
const MaxSize int64 = 16 << 40

// Ext4Options are the mkfs.ext4 knobs exposed through the configuration.
type Ext4Options struct {
	// Features is passed to mkfs.ext4 -O (e.g. "^metadata_csum", "^has_journal").
	Features []string
	// ExtraArgs are appended verbatim to the mkfs.ext4 command line.
	ExtraArgs []string
}

// CreateExt4 makes a new sparse file of size bytes at path holding an empty
// ext4 filesystem whose root is 0755 root:root and which has no lost+found
// (containerd's layer diffs compare directory trees; lost+found would show up
// as a foreign entry). The file is fsynced. On error path is removed.
func CreateExt4(ctx context.Context, path string, size int64, o Ext4Options) (err error) {
	if size < MinSize || size > MaxSize {
		return fmt.Errorf("create image %s: size %d out of range [%d, %d]", path, size, MinSize, MaxSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create image %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("create image %s: truncate to %d: %w", path, size, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create image %s: %w", path, err)
	}
	// lazy_itable_init/lazy_journal_init keep mkfs O(1) on a sparse file; nodiscard
	// avoids punching holes in what is already a hole. -m 0: a container rootfs
	// needs no blocks reserved for root.
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0",
		"-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0"}
	if len(o.Features) > 0 {
		args = append(args, "-O", strings.Join(o.Features, ","))
	}
	args = append(args, o.ExtraArgs...)
	args = append(args, path)
	if err := run(ctx, "mkfs.ext4", args...); err != nil {
		return fmt.Errorf("create image %s: %w", path, err)
	}
	if err := run(ctx, "debugfs", "-w", "-R", "rmdir lost+found", path); err != nil {
		return fmt.Errorf("create image %s: remove lost+found: %w", path, err)
	}
	if err := SyncFile(path); err != nil {
		return fmt.Errorf("create image %s: %w", path, err)
	}
	return nil
}

// Grow enlarges the filesystem in an unmounted image to size bytes. Shrinking
// is refused: resize2fs would have to move data and could fail half way.
func Grow(ctx context.Context, path string, size int64) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("grow image: %w", err)
	}
	if size == st.Size() {
		return nil
	}
	if size < st.Size() || size > MaxSize {
		return fmt.Errorf("grow image %s from %d to %d bytes: only growing up to %d is supported", path, st.Size(), size, MaxSize)
	}
	if err := os.Truncate(path, size); err != nil {
		return fmt.Errorf("grow image %s: %w", path, err)
	}
	// resize2fs insists on a freshly checked filesystem; -p preens (fixes only
	// what is safe), exit code 1 means "errors corrected" and is fine.
	if err := run(ctx, "e2fsck", "-f", "-p", path); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return fmt.Errorf("grow image %s: check: %w", path, err)
		}
	}
	if err := run(ctx, "resize2fs", path); err != nil {
		return fmt.Errorf("grow image %s: %w", path, err)
	}
	return SyncFile(path)
}

// Clone makes dst a reflink of src (FICLONE). dst must not exist. On error dst is removed.
func Clone(dst, src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("clone %s to %s: %w", src, dst, cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		return fmt.Errorf("clone %s to %s: FICLONE: %w", src, dst, err)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("clone %s to %s: fsync: %w", src, dst, err)
	}
	return nil
}

// Copy copies src to a new file dst, keeping holes: only the ranges that
// SEEK_DATA reports are copied, so a mostly-empty 10 GiB image costs what it
// holds. The data goes through user space on purpose: copy_file_range would
// silently reflink on XFS/btrfs, and copy mode must never share extents.
// dst must not exist. On error (ENOSPC included) dst is removed.
func Copy(dst, src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("copy %s to %s: %w", src, dst, cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
		}
	}()
	size := st.Size()
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("copy %s to %s: truncate: %w", src, dst, err)
	}
	inFd := int(in.Fd())
	buf := make([]byte, 1<<20)
	var off int64
	for off < size {
		data, err := unix.Seek(inFd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("copy %s to %s: seek data at %d: %w", src, dst, off, err)
		}
		hole, err := unix.Seek(inFd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("copy %s to %s: seek hole at %d: %w", src, dst, data, err)
		}
		if _, err := io.CopyBuffer(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data), buf); err != nil {
			return fmt.Errorf("copy %s to %s: range [%d,%d): %w", src, dst, data, hole, err)
		}
		off = hole
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("copy %s to %s: fsync: %w", src, dst, err)
	}
	return nil
}

// ProbeReflink reports whether files in dir can be reflinked, by cloning a
// small scratch file. Any FICLONE failure other than "not supported here"
// is returned as an error.
func ProbeReflink(dir string) (bool, error) {
	src, err := os.CreateTemp(dir, ".probe-src-")
	if err != nil {
		return false, fmt.Errorf("probe reflink in %s: %w", dir, err)
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := src.Write(bytes.Repeat([]byte{0xc5}, 64<<10)); err != nil {
		return false, fmt.Errorf("probe reflink in %s: %w", dir, err)
	}
	dst := filepath.Join(dir, filepath.Base(src.Name())+".clone")
	err = Clone(dst, src.Name())
	if err == nil {
		_ = os.Remove(dst)
		return true, nil
	}
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTTY, unix.EINVAL, unix.EXDEV, unix.ENOSYS} {
		if errors.Is(err, e) {
			return false, nil
		}
	}
	return false, fmt.Errorf("probe reflink in %s: %w", dir, err)
}

// SyncFile fsyncs a file by name.
func SyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}

// SyncDir fsyncs a directory so renames and unlinks inside it are durable.
func SyncDir(dir string) error {
	return SyncFile(dir)
}

// Allocated returns the bytes the file occupies on disk (shared extents counted fully).
func Allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 512 {
			msg = msg[:512] + "…"
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}
