package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// run runs a host tool through the shared reaper (which would otherwise
// steal the child's exit status from exec.Cmd.Wait).
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	_, ch, err := testReaper(t).Start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	e := <-ch
	b, _ := os.ReadFile(out.Name())
	if e.Code() != 0 {
		t.Fatalf("%s %v: exit %d: %s", name, args, e.Code(), b)
	}
	return string(b)
}

// rootfsDisk is a busybox rootfs in a 64 MiB ext4 image on a loop device
// with serial in a fake /sys/block (loopDisk), whose read_ahead_kb reads
// 128: it returns the device, the fake /sys/block and that file. Root
// only; skips without the tools.
func rootfsDisk(t *testing.T, serial string) (dev, sys, ra string) {
	needRoot(t)
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (e2fsprogs, util-linux) to build a test disk", tool)
		}
	}
	img := filepath.Join(t.TempDir(), "rootfs.ext4")
	run(t, "mkfs.ext4", "-q", "-F", "-d", makeRootfs(t), img, "64M")
	dev, sys = loopDisk(t, img, serial)
	ra = filepath.Join(sys, filepath.Base(dev), "queue", "read_ahead_kb")
	os.MkdirAll(filepath.Dir(ra), 0o755)
	os.WriteFile(ra, []byte("128\n"), 0o644)
	return dev, sys, ra
}

// A disk found by serial, mounted as a container rootfs, frozen and thawed.
// A loop device stands in for the virtio-blk disk; a fake /sys/block gives
// it the serial the VMM would.
func TestDiskRootfsFreezeThaw(t *testing.T) {
	dev, sys, ra := rootfsDisk(t, "cube-rootfs-1")
	h := newHarness(t, func(c *Config) { c.SysBlock = sys })
	ctx := context.Background()

	m, err := h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "cube-rootfs-1"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(ra); err != nil || string(b) != strconv.Itoa(mountReadaheadKiB) {
		t.Errorf("read_ahead_kb of the mounted disk: %q %v, want %d", b, err, mountReadaheadKiB)
	}
	t.Cleanup(func() { unix.Unmount(m.MountPoint, unix.MNT_DETACH) })
	if m.Device != dev {
		t.Errorf("device %s, want %s", m.Device, dev)
	}
	_, err = h.client.MountDisk(ctx, &protocol.MountDiskRequest{Serial: "cube-rootfs-1"})
	wantCode(t, err, codes.FailedPrecondition, "already has disk")

	spec := testSpec("", "sh", "-c", "echo on-disk > /marker")
	spec.Root = nil
	if _, err := h.client.CreateContainer(ctx, &protocol.CreateContainerRequest{ContainerId: "d", Spec: specJSON(t, spec), Rootfs: m.MountPoint}); err != nil {
		t.Fatal(err)
	}
	h.start("d", "")
	if w := h.wait("d", ""); w.ExitStatus != 0 {
		t.Fatalf("exit %d", w.ExitStatus)
	}
	if _, err := h.client.Delete(ctx, &protocol.DeleteRequest{ContainerId: "d"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(m.MountPoint, "marker")); err != nil || string(b) != "on-disk\n" {
		t.Fatalf("marker on disk: %q %v", b, err)
	}

	fr, err := h.client.FreezeFilesystems(ctx, &protocol.FreezeRequest{})
	if err != nil || len(fr.Frozen) != 1 || fr.Frozen[0] != m.MountPoint {
		t.Fatalf("freeze: %v %v", fr, err)
	}
	// The kernel refuses to freeze a frozen filesystem: proof it is frozen.
	if err := fsIoctl(m.MountPoint, ioctlFIFREEZE); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("second FIFREEZE: %v, want EBUSY", err)
	}
	_, err = h.client.UnmountDisk(ctx, &protocol.UnmountDiskRequest{MountPoint: m.MountPoint})
	wantCode(t, err, codes.FailedPrecondition, "is frozen")
	if _, err := h.client.ThawFilesystems(ctx, &protocol.ThawRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := fsIoctl(m.MountPoint, ioctlFITHAW); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("FITHAW after thaw: %v, want EINVAL (not frozen)", err)
	}
	if _, err := h.client.UnmountDisk(ctx, &protocol.UnmountDiskRequest{MountPoint: m.MountPoint}); err != nil {
		t.Fatal(err)
	}
}

// Freshen's mount is MountDisk's: found by serial, mounted, readahead set.
func TestFreshenMountsDisk(t *testing.T) {
	dev, sys, ra := rootfsDisk(t, "cube-rootfs-2")
	var clock time.Time
	h := newHarness(t, func(c *Config) {
		c.SysBlock = sys
		c.SetClock = func(t time.Time) error { clock = t; return nil }
	})
	now := time.Now()
	r, err := h.client.Freshen(context.Background(), &protocol.FreshenRequest{UnixNano: now.UnixNano(), Entropy: make([]byte, 64),
		Mount: &protocol.MountDiskRequest{Serial: "cube-rootfs-2", Options: []string{"noinit_itable"}}})
	if err != nil {
		t.Fatal(err)
	}
	m := r.GetMount()
	t.Cleanup(func() { unix.Unmount(m.GetMountPoint(), unix.MNT_DETACH) })
	if m.GetDevice() != dev || !strings.Contains(m.GetTiming(), "mount=") || !clock.Equal(now) {
		t.Fatalf("Freshen mount %+v, clock %v: want %s mounted with its timing, clock %v", m, clock, dev, now)
	}
	if b, err := os.ReadFile(ra); err != nil || string(b) != strconv.Itoa(mountReadaheadKiB) {
		t.Errorf("read_ahead_kb: %q %v, want %d", b, err, mountReadaheadKiB)
	}
	if _, err := os.Stat(filepath.Join(m.GetMountPoint(), "bin")); err != nil {
		t.Errorf("the rootfs is not at %s: %v", m.GetMountPoint(), err)
	}
}
