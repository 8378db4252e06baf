package template

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
// replacement changes the inode).
func fileDigest(cacheDir, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	f, err := os.Open(abs)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", abs)
	}
	stamp := statStamp(st)
	ph := sha256.Sum256([]byte(abs))
	entry := filepath.Join(cacheDir, hex.EncodeToString(ph[:12]))
	if b, err := os.ReadFile(entry); err == nil {
		if s, d, ok := strings.Cut(strings.TrimSpace(string(b)), " digest="); ok && s == stamp && len(d) == 64 {
			return d, nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", abs, err)
	}
	d := hex.EncodeToString(h.Sum(nil))
	// Ordering: the stamp is the one taken before reading; a file changed
	// while being read gets a new ctime and is hashed again next time.
	// The cache lives in the template root, which Key does not create (a
	// shim whose config names missing files must not leave a root behind).
	if err := os.Mkdir(cacheDir, 0o700); err == nil || errors.Is(err, fs.ErrExist) {
		tmp := fmt.Sprintf("%s.%d", entry, os.Getpid())
		if os.WriteFile(tmp, []byte(stamp+" digest="+d+"\n"), 0o600) == nil {
			_ = os.Rename(tmp, entry)
		}
	}
	return d, nil
}

func statStamp(st os.FileInfo) string {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprintf("size=%d mtime=%d", st.Size(), st.ModTime().UnixNano())
	}
	return fmt.Sprintf("dev=%d ino=%d size=%d mtime=%d.%d ctime=%d.%d",
		s.Dev, s.Ino, s.Size, s.Mtim.Sec, s.Mtim.Nsec, s.Ctim.Sec, s.Ctim.Nsec)
}
