package store

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// writeAtomic makes dir/name hold b: written to a temporary file beside it,
// fsynced, renamed over name, and the directory fsynced. A reader sees the
// old file or the new one, never a part; a crash leaves at most a
// ".name.tmp-*" file, which Collect removes.
func writeAtomic(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	// Ordering: the data is on disk (fsync) before the rename publishes it,
	// and the rename is on disk (directory fsync) before we return.
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory, making the renames and removals in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// diskUsage is the space the regular files under dir occupy (allocated
// blocks, so holes are not counted; extents shared by reflink are counted in
// full in every file sharing them).
func diskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// readDirNames lists dir; a missing dir is empty.
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}
