package snapshot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Writer builds a snapshot directory under a temporary name. Nothing
// appears under the final name until Commit succeeds; Abort (or a crash)
// leaves only a ".tmp-" directory, which Open never accepts.
type Writer struct {
	final, tmp string
	files      []string
	committed  bool
}

// Create starts a snapshot at dir, which must not exist. need is the
// number of bytes the caller is about to write (memory and disk copies,
// an upper bound); Create refuses when the filesystem has less free.
func Create(dir string, need int64) (*Writer, error) {
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("%s already exists: a snapshot goes into a new directory", dir)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	parent := filepath.Dir(dir)
	var st unix.Statfs_t
	if err := unix.Statfs(parent, &st); err != nil {
		return nil, fmt.Errorf("snapshot %s: statfs: %w", dir, err)
	}
	if free := int64(st.Bavail) * st.Bsize; need > 0 && free < need {
		return nil, fmt.Errorf("snapshot %s: %d MiB free on %s, need up to %d MiB", dir, free>>20, parent, need>>20)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	return &Writer{final: dir, tmp: tmp}, nil
}

// Dir is the temporary directory being written.
func (w *Writer) Dir() string { return w.tmp }

// Final is the directory the snapshot will have after Commit.
func (w *Writer) Final() string { return w.final }

// CreateFile creates name in the snapshot (fsynced at Commit).
func (w *Writer) CreateFile(name string) (*os.File, error) {
	if err := localName(name); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(w.tmp, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	w.files = append(w.files, name)
	return f, nil
}

// CloneDisk copies src into the snapshot as name: a reflink where the
// filesystem supports it (instant, shares blocks copy-on-write), else a
// full copy. It returns the size and whether a reflink was made.
func (w *Writer) CloneDisk(src, name string) (int64, bool, error) {
	f, err := w.CreateFile(name)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	return cloneInto(f, src)
}

// cloneInto makes dst's contents a copy of the file at src.
func cloneInto(dst *os.File, src string) (int64, bool, error) {
	s, err := os.Open(src)
	if err != nil {
		return 0, false, fmt.Errorf("clone %s: %w", src, err)
	}
	defer s.Close()
	fi, err := s.Stat()
	if err != nil {
		return 0, false, fmt.Errorf("clone %s: %w", src, err)
	}
	if err := unix.IoctlFileClone(int(dst.Fd()), int(s.Fd())); err == nil {
		return fi.Size(), true, nil
	}
	if !fi.Mode().IsRegular() {
		// A block device: no holes to keep, and its Stat size is 0.
		if err := dst.Truncate(0); err != nil {
			return 0, false, fmt.Errorf("clone %s: %w", src, err)
		}
		n, err := io.Copy(io.NewOffsetWriter(dst, 0), s)
		if err != nil {
			return 0, false, fmt.Errorf("copy %s: %w", src, err)
		}
		return n, false, nil
	}
	// No reflink (ext4, tmpfs, cross-device): copy what the file holds.
	if err := copySparse(dst, s, fi.Size()); err != nil {
		return 0, false, fmt.Errorf("copy %s: %w", src, err)
	}
	return fi.Size(), false, nil
}

// copySparse makes dst (empty or not) a copy of the first size bytes of
// src that keeps src's holes: only the ranges SEEK_DATA finds are copied,
// so a 64 MiB rootfs image holding 8 MiB, or a drive slot's sparse stub,
// costs what it holds, not its size. The copy stays in the kernel
// (copy_file_range) where it can, and goes through a buffer where it cannot
// (two file systems of different types). A file system without SEEK_DATA
// reports the whole file as data: a full copy.
func copySparse(dst, src *os.File, size int64) error {
	// Ordering: emptied first, so no byte of dst's old contents survives
	// in a range that is a hole in src.
	if err := dst.Truncate(0); err != nil {
		return err
	}
	if err := dst.Truncate(size); err != nil {
		return err
	}
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seek data at %d: %w", off, err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole at %d: %w", data, err)
		}
		hole = min(hole, size)
		if data >= hole {
			return nil
		}
		if err := copyRange(dst, src, data, hole); err != nil {
			return fmt.Errorf("range [%d,%d): %w", data, hole, err)
		}
		off = hole
	}
	return nil
}

// copyRange copies [from, to) of src to the same offsets of dst.
func copyRange(dst, src *os.File, from, to int64) error {
	in, out := from, from
	for in < to {
		n, err := unix.CopyFileRange(int(src.Fd()), &in, int(dst.Fd()), &out, int(min(to-in, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP):
			// Not between these two files: through a buffer.
			_, err := io.Copy(io.NewOffsetWriter(dst, in), io.NewSectionReader(src, in, to-in))
			return err
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("source ends at %d: it shrank while it was copied", in)
		}
	}
	return nil
}

// CloneFile makes the file at dst a copy of src (reflink or copy), via a
// temporary name and rename, so dst is either the old or the new file.
func CloneFile(dst, src string) (bool, error) {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return false, err
	}
	tmp := f.Name()
	_, reflinked, err := cloneInto(f, src)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return false, err
	}
	return reflinked, nil
}

// Commit writes the state file and the manifest, fsyncs everything and
// renames the directory into place.
func (w *Writer) Commit(m *Manifest, statePayload []byte) error {
	if w.committed {
		return errors.New("snapshot: already committed")
	}
	state, err := EncodeState(statePayload)
	if err != nil {
		return err
	}
	m.FormatVersion = Version
	if m.Created == "" {
		m.Created = time.Now().UTC().Format(time.RFC3339Nano)
	}
	m.State = StateFile{File: StateName, Size: int64(len(state))}
	if err := m.validate(); err != nil {
		return fmt.Errorf("snapshot manifest: %w", err)
	}
	if err := w.writeFile(StateName, state); err != nil {
		return err
	}
	mb, err := marshalManifest(m)
	if err != nil {
		return err
	}
	for _, n := range w.files {
		if err := syncPath(filepath.Join(w.tmp, n)); err != nil {
			return fmt.Errorf("snapshot: fsync %s: %w", n, err)
		}
	}
	// The manifest last: a directory with a manifest has all its files.
	if err := w.writeFile(ManifestName, mb); err != nil {
		return err
	}
	if err := syncPath(w.tmp); err != nil {
		return fmt.Errorf("snapshot: fsync dir: %w", err)
	}
	// Rename fails if the final name appeared meanwhile (a non-empty dir).
	if err := os.Rename(w.tmp, w.final); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	w.committed = true
	if err := syncPath(filepath.Dir(w.final)); err != nil {
		return fmt.Errorf("snapshot: fsync parent: %w", err)
	}
	return nil
}

func (w *Writer) writeFile(name string, b []byte) error {
	f, err := w.CreateFile(name)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("snapshot: write %s: %w", name, err)
	}
	return nil
}

// Abort removes the temporary directory (no-op after Commit).
func (w *Writer) Abort() {
	if !w.committed {
		os.RemoveAll(w.tmp)
	}
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Snapshot is an opened, validated snapshot directory.
type Snapshot struct {
	Dir      string
	Manifest *Manifest
	// State is the state file's payload (checksum verified).
	State []byte
}

// Open reads and validates the snapshot at dir: manifest version and
// fields, state file magic, version and CRC, memory layer and bitmap
// sizes, disk copy sizes. It reads no memory contents.
func Open(dir string) (*Snapshot, error) {
	dir = filepath.Clean(dir)
	mf, err := os.Open(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	mb, err := readBounded(mf, maxManifest)
	mf.Close()
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: manifest: %w", dir, err)
	}
	m, err := ParseManifest(mb)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	s := &Snapshot{Dir: dir, Manifest: m}
	sf, err := os.Open(s.Path(m.State.File))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	sb, err := readBounded(sf, MaxStateSize+stateOverhead)
	sf.Close()
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: state: %w", dir, err)
	}
	if int64(len(sb)) != m.State.Size {
		return nil, fmt.Errorf("snapshot %s: state file is %d bytes, manifest says %d: %w", dir, len(sb), m.State.Size, ErrTruncated)
	}
	if s.State, err = DecodeState(sb); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	for i, l := range m.Memory {
		fi, err := os.Stat(s.Path(l.File))
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: memory layer %d: %w", dir, i, err)
		}
		if fi.Size() != l.Size {
			return nil, fmt.Errorf("snapshot %s: memory layer %d (%s) is %d bytes, manifest says %d: %w", dir, i, l.File, fi.Size(), l.Size, ErrTruncated)
		}
		if l.Bitmap != "" {
			fi, err := os.Stat(s.Path(l.Bitmap))
			if err != nil {
				return nil, fmt.Errorf("snapshot %s: memory layer %d bitmap: %w", dir, i, err)
			}
			if want := BitmapBytes(l.Size); fi.Size() != want {
				return nil, fmt.Errorf("snapshot %s: memory layer %d bitmap is %d bytes, want %d: %w", dir, i, fi.Size(), want, ErrTruncated)
			}
		}
	}
	for i, d := range m.Shape.Disks {
		if d.File == "" {
			continue
		}
		fi, err := os.Stat(s.Path(d.File))
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: disk %d: %w", dir, i, err)
		}
		if fi.Size() != d.Size {
			return nil, fmt.Errorf("snapshot %s: disk %d copy is %d bytes, manifest says %d: %w", dir, i, fi.Size(), d.Size, ErrTruncated)
		}
	}
	return s, nil
}

// Path resolves a file name of the manifest.
func (s *Snapshot) Path(name string) string { return filepath.Join(s.Dir, name) }

// PrepareClone copies src (reflink or copy) to a new temporary file
// beside dst and returns its name; the caller renames it over dst (an
// atomic switch) or removes it.
func PrepareClone(dst, src string) (tmp string, reflinked bool, err error) {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".rollback-")
	if err != nil {
		return "", false, err
	}
	tmp = f.Name()
	_, reflinked, err = cloneInto(f, src)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", false, err
	}
	return tmp, reflinked, nil
}
