// Package xfspool gives root tests a reflink-capable filesystem: a sparse
// file formatted with mkfs.xfs -m reflink=1 and loop-mounted. Everything is
// unmounted, detached and deleted when the test ends.
package xfspool

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Missing says what a pool needs and this machine lacks, or "" if nothing.
func Missing() string {
	if os.Geteuid() != 0 {
		return "not running as root (loop mounts need root)"
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		return "mkfs.xfs not found (apt-get install xfsprogs)"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "no /dev/loop-control (loop devices unavailable)"
	}
	return ""
}

// New makes a pool of size bytes (sparse) and returns its mount point. The test
// is skipped, saying why, when root, mkfs.xfs or loop devices are missing.
func New(tb testing.TB, size int64) string {
	tb.Helper()
	if m := Missing(); m != "" {
		tb.Skipf("XFS reflink pool unavailable: %s", m)
	}
	dir, err := os.MkdirTemp("", "cube-xfspool-")
	if err != nil {
		tb.Fatal(err)
	}
	img := filepath.Join(dir, "pool.img")
	mnt := filepath.Join(dir, "mnt")
	cleanup := func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil && !strings.Contains(string(out), "not mounted") {
			tb.Errorf("unmount pool %s: %v: %s", mnt, err, out)
		}
		os.RemoveAll(dir)
	}
	if err := Create(img, mnt, size); err != nil {
		cleanup()
		tb.Fatal(err)
	}
	tb.Cleanup(cleanup)
	return mnt
}

// Create formats img as an XFS filesystem with reflink and mounts it at mnt.
// The loop device detaches itself on unmount (mount -o loop sets autoclear).
func Create(img, mnt string, size int64) error {
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("pool image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("pool image: %w", err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.xfs %s: %v: %s", img, err, out)
	}
	if out, err := exec.Command("mount", "-t", "xfs", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("mount %s: %v: %s", img, err, out)
	}
	return nil
}
