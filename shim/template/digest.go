package template

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

var lookPath = exec.LookPath

// fileDigest is the sha256 of path's content. Hashing a kernel, an initrd
// and the VMM at every sandbox start would cost more than the restore
// saves on a slow host, so the digest is kept in cacheDir under the path's
// hash with the file's device, inode, size, mtime and ctime, and reused
// while those are unchanged (a rewrite in place changes mtime and ctime; a
// replacement changes the inode). A digest computed now comes back with
// the cache entry to save (nil on a hit): saveDigests writes them once
// every file of a key was found.
func fileDigest(cacheDir, path string) (string, *digestEntry, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", nil, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", nil, err
	}
	if !st.Mode().IsRegular() {
		return "", nil, fmt.Errorf("%s is not a regular file", abs)
	}
	stamp := statStamp(st)
	ph := sha256.Sum256([]byte(abs))
	entry := filepath.Join(cacheDir, hex.EncodeToString(ph[:12]))
	if b, err := os.ReadFile(entry); err == nil {
		if s, d, ok := strings.Cut(strings.TrimSpace(string(b)), " digest="); ok && s == stamp && len(d) == 64 {
			return d, nil, nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", nil, fmt.Errorf("read %s: %w", abs, err)
	}
	d := hex.EncodeToString(h.Sum(nil))
	// Ordering: the stamp is the one taken before reading; a file changed
	// while being read gets a new ctime and is hashed again next time.
	return d, &digestEntry{path: entry, line: stamp + " digest=" + d + "\n"}, nil
}

// digestEntry is a digest cache file to write.
type digestEntry struct{ path, line string }

// saveDigests writes cache entries into cacheDir, making it (and the
// template root it is in) if needed. Key calls it only once every file was
// found: a shim whose config names missing files leaves no root behind.
// The cache is an optimisation: failures to write it are ignored.
func saveDigests(cacheDir string, entries []*digestEntry) {
	if len(entries) == 0 || os.MkdirAll(cacheDir, 0o700) != nil {
		return
	}
	for _, e := range entries {
		tmp := fmt.Sprintf("%s.%d", e.path, os.Getpid())
		if os.WriteFile(tmp, []byte(e.line), 0o600) == nil {
			_ = os.Rename(tmp, e.path)
		}
	}
}

func statStamp(st os.FileInfo) string {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprintf("size=%d mtime=%d", st.Size(), st.ModTime().UnixNano())
	}
	return fmt.Sprintf("dev=%d ino=%d size=%d mtime=%d.%d ctime=%d.%d",
		s.Dev, s.Ino, s.Size, s.Mtim.Sec, s.Mtim.Nsec, s.Ctim.Sec, s.Ctim.Nsec)
}
