package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"golang.org/x/sys/unix"
)

func TestExtFSBytes(t *testing.T) {
	sb := make([]byte, extSuperblockSize)
	if _, ok := extFSBytes(sb); ok {
		t.Error("zeroed superblock taken for ext")
	}
	binary.LittleEndian.PutUint16(sb[extMagicOff:], extMagic)
	binary.LittleEndian.PutUint32(sb[extBlocksLoOff:], 8192)
	binary.LittleEndian.PutUint32(sb[extLogBlockOff:], 2) // 4 KiB blocks
	if n, ok := extFSBytes(sb); !ok || n != 32<<20 {
		t.Errorf("32 MiB file system: %d %v", n, ok)
	}
	// The high word counts only with the 64bit feature.
	binary.LittleEndian.PutUint32(sb[extBlocksHiOff:], 1)
	if n, _ := extFSBytes(sb); n != 32<<20 {
		t.Errorf("blocks_hi used without 64bit: %d", n)
	}
	binary.LittleEndian.PutUint32(sb[extIncompatOff:], extIncompat64Bit)
	if n, _ := extFSBytes(sb); n != (1<<32+8192)*4096 {
		t.Errorf("64bit file system: %d", n)
	}
	// Untrusted input: an absurd block size or a short buffer is not ext.
	binary.LittleEndian.PutUint32(sb[extLogBlockOff:], 40)
	if _, ok := extFSBytes(sb); ok {
		t.Error("block size 2^50 accepted")
	}
	if _, ok := extFSBytes(sb[:100]); ok {
		t.Error("short superblock accepted")
	}
}

func FuzzExtFSBytes(f *testing.F) {
	f.Add(make([]byte, extSuperblockSize))
	f.Fuzz(func(t *testing.T, sb []byte) {
		if n, ok := extFSBytes(sb); !ok && n != 0 {
			t.Fatal("size without a file system")
		}
	})
}

// loopDisk attaches img to a loop device and gives it serial in a fake
// /sys/block; returns the device and the sysfs dir.
func loopDisk(t *testing.T, img, serial string, extra ...string) (dev, sys string) {
	t.Helper()
	dev = strings.TrimSpace(run(t, "losetup", append(append([]string{"-f", "--show"}, extra...), img)...))
	t.Cleanup(func() { run(t, "losetup", "-d", dev) })
	sys = t.TempDir()
	os.MkdirAll(filepath.Join(sys, filepath.Base(dev)), 0o755)
	os.WriteFile(filepath.Join(sys, filepath.Base(dev), "serial"), []byte(serial+"\n"), 0o444)
	return dev, sys
}

func extImage(t *testing.T, marker, size string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), marker+".ext4")
	run(t, "mkfs.ext4", "-q", "-F", "-d", root, img, size)
	return img
}

// TestMountDiskAfterMediaChange is what a drive slot goes through when
// cube-vmm re-points it (disk-set): the device's bytes change under a
// cached page of the old disk, and the new, larger capacity arrives after
// MountDisk was asked. A loop device stands in for the virtio-blk disk:
// its backing file is overwritten behind its page cache, and `losetup -c`
// plays the config-change interrupt.
func TestMountDiskAfterMediaChange(t *testing.T) {
	needRoot(t)
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (e2fsprogs, util-linux) to build a test disk", tool)
		}
	}
	oldImg, newImg := extImage(t, "old", "16M"), extImage(t, "new", "32M")
	backing := filepath.Join(t.TempDir(), "slot.img")
	b, _ := os.ReadFile(oldImg)
	if err := os.WriteFile(backing, b, 0o644); err != nil {
		t.Fatal(err)
	}
	dev, sys := loopDisk(t, backing, "cube-slot-1")
	// Something holds the device open across the swap and has read its
	// superblock: those pages stay in the device's cache.
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	cached := make([]byte, 64<<10)
	if _, err := holder.ReadAt(cached, 0); err != nil {
		t.Fatal(err)
	}
	// The media change: new bytes (a 32 MiB file system), old capacity.
	nb, _ := os.ReadFile(newImg)
	if err := os.WriteFile(backing, nb, 0o644); err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, func(c *Config) { c.SysBlock = sys })
	ctx := context.Background()
	type result struct {
		m   *protocol.MountDiskResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "cube-slot-1"})
		done <- result{m, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			unix.Unmount(r.m.MountPoint, unix.MNT_DETACH)
		}
		t.Fatalf("MountDisk returned before the capacity change reached the device: %+v %v", r.m, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	run(t, "losetup", "-c", dev) // the capacity change arrives
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("MountDisk still waiting after the capacity change")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { unix.Unmount(r.m.MountPoint, unix.MNT_DETACH) })
	if got, err := os.ReadFile(filepath.Join(r.m.MountPoint, "marker")); err != nil || string(got) != "new" {
		t.Fatalf("mounted %q (%v), want the new disk's marker", got, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.m.MountPoint, &st); err != nil || uint64(st.Blocks)*uint64(st.Bsize) < 16<<20 {
		t.Errorf("mounted file system has %d blocks of %d: not the 32 MiB one (%v)", st.Blocks, st.Bsize, err)
	}
	// The device was already mounted: a second mount elsewhere is refused.
	_, err = h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "cube-slot-1", MountPoint: filepath.Join(t.TempDir(), "again")})
	if err == nil || !strings.Contains(err.Error(), "already mounted") {
		t.Errorf("second mount of one device: %v", err)
	}
	if _, err := h.client.UnmountDisk(ctx, &protocol.UnmountDiskRequest{MountPoint: r.m.MountPoint}); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(cached[1024:2048], nb[1024:2048]) {
		t.Error("test setup: old and new superblocks are equal")
	}
}

// A capacity that never grows: MountDisk gives up with the sizes, not a
// mount error about the geometry.
func TestMountDiskCapacityNeverArrives(t *testing.T) {
	needRoot(t)
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (e2fsprogs, util-linux) to build a test disk", tool)
		}
	}
	img := extImage(t, "big", "32M")
	_, sys := loopDisk(t, img, "cube-slot-2", "--sizelimit", "8M")
	h := newHarness(t, func(c *Config) { c.SysBlock = sys; c.DiskSettleTimeout = 300 * time.Millisecond })
	_, err := h.client.MountDisk(context.Background(), &protocol.MountDiskRequest{Serial: "cube-slot-2"})
	if err == nil || !strings.Contains(err.Error(), "did not reach the guest") || !strings.Contains(err.Error(), "8388608 bytes") {
		t.Fatalf("MountDisk on a device smaller than its file system: %v", err)
	}
}
