// Package volumetest writes directories the way the kubelet's atomic writer
// (pkg/volume/util/atomic_writer.go) does, for tests of volume syncing.
package volumetest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// WriteAtomic makes dir hold files (key → content, mode 0644) as the
// kubelet does for a configMap, secret, projected or downwardAPI volume:
//  1. a new timestamped directory "..<time>" with the files,
//  2. a link "..data_tmp" to it renamed over "..data" (the atomic swap),
//  3. a link "<key>" → "..data/<key>" for each new key,
//  4. links of keys no longer there removed, the old directory removed.
func WriteAtomic(dir string, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	ts := "..2026_" + time.Now().UTC().Format("01_02_15_04_05.000000000")
	if ts == old {
		ts += "1"
	}
	tsDir := filepath.Join(dir, ts)
	if err := os.Mkdir(tsDir, 0o755); err != nil {
		return err
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.Contains(k, "/") || strings.HasPrefix(k, "..") {
			return fmt.Errorf("key %q: the kubelet's keys are plain names", k)
		}
		if err := os.WriteFile(filepath.Join(tsDir, k), []byte(files[k]), 0o644); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for _, k := range keys {
		l := filepath.Join(dir, k)
		if _, err := os.Lstat(l); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), l); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		if _, ok := files[n]; !ok && !strings.HasPrefix(n, "..") {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	if old != "" && old != ts {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
