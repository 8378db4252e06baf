package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// fakeSysDisk makes <sys>/<name>/{serial,dev,size} as a virtio-blk disk has.
func fakeSysDisk(t *testing.T, sys, name, serial, dev string, sectors uint64) {
	t.Helper()
	d := filepath.Join(sys, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{"serial": serial + "\n", "dev": dev + "\n", "size": fmt.Sprintf("%d\n", sectors)} {
		if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSysDevNumbers(t *testing.T) {
	f := filepath.Join(t.TempDir(), "dev")
	os.WriteFile(f, []byte("253:16\n"), 0o644)
	if ma, mi, err := sysDevNumbers(f); err != nil || ma != 253 || mi != 16 {
		t.Errorf("sysDevNumbers = %d:%d, %v; want 253:16", ma, mi, err)
	}
	for _, bad := range []string{"253", "x:1", "1:-2", ""} {
		os.WriteFile(f, []byte(bad), 0o644)
		if _, _, err := sysDevNumbers(f); err == nil {
			t.Errorf("sysDevNumbers(%q): no error", bad)
		}
	}
}

// waitCapacity returns once sysfs shows the medium's size (the guest driver
// learns it asynchronously), and fails naming both sizes when it never does.
func TestWaitCapacity(t *testing.T) {
	sys := t.TempDir()
	fakeSysDisk(t, sys, "vdc", "cube-slot-2", "253:32", 8)
	h := newHarness(t, func(c *Config) { c.DiskSettleTimeout = 300 * time.Millisecond })
	dir := filepath.Join(sys, "vdc")
	go func() {
		time.Sleep(30 * time.Millisecond)
		os.WriteFile(filepath.Join(dir, "size.tmp"), []byte("2048\n"), 0o644)
		os.Rename(filepath.Join(dir, "size.tmp"), filepath.Join(dir, "size"))
	}()
	n, err := h.svc.waitCapacity(context.Background(), dir, 2048*sectorSize)
	if err != nil || n != 2048*sectorSize {
		t.Fatalf("waitCapacity = %d, %v; want %d", n, err, 2048*sectorSize)
	}
	if n, err := h.svc.waitCapacity(context.Background(), dir, 0); err != nil || n != 2048*sectorSize {
		t.Errorf("waitCapacity(0) = %d, %v: want the size at once", n, err)
	}
	_, err = h.svc.waitCapacity(context.Background(), dir, 4096*sectorSize)
	wantCode(t, err, codes.DeadlineExceeded, "vdc is 1048576 bytes, its medium 2097152")
}

// BlockDevice refuses a malformed serial, an unknown one, and a disk the
// agent mounted (a rootfs is not a raw volume).
func TestBlockDeviceErrors(t *testing.T) {
	sys := t.TempDir()
	fakeSysDisk(t, sys, "vdb", "cube-slot-1", "253:16", 8)
	h := newHarness(t, func(c *Config) { c.SysBlock, c.DevDir = sys, t.TempDir() })
	ctx := context.Background()
	_, err := h.client.BlockDevice(ctx, &protocol.BlockDeviceRequest{Serial: "a/b"})
	wantCode(t, err, codes.InvalidArgument, "a/b")
	_, err = h.client.BlockDevice(ctx, &protocol.BlockDeviceRequest{Serial: "cube-slot-7"})
	wantCode(t, err, codes.NotFound, "cube-slot-7")

	dev := filepath.Join(h.svc.cfg.DevDir, "vdb")
	os.WriteFile(dev, nil, 0o600)
	h.svc.mu.Lock()
	h.svc.disks["/run/cube/disks/cube-slot-1"] = dev
	h.svc.mu.Unlock()
	_, err = h.client.BlockDevice(ctx, &protocol.BlockDeviceRequest{Serial: "cube-slot-1"})
	wantCode(t, err, codes.FailedPrecondition, "mounted at /run/cube/disks/cube-slot-1")
}

// The whole RPC on a real block device: a loop device stands in for the
// slot's /dev/vdX (a fake /sys/block gives it the serial and, late, the
// medium's capacity); the answer carries its device numbers.
func TestBlockDeviceLoop(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup (util-linux) for a test block device")
	}
	img := filepath.Join(t.TempDir(), "vol.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(run(t, "losetup", "-f", "--show", img))
	t.Cleanup(func() { run(t, "losetup", "-d", dev) })
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	sys := t.TempDir()
	name := filepath.Base(dev)
	fakeSysDisk(t, sys, name, "cube-slot-3", fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), 8)
	go func() {
		time.Sleep(20 * time.Millisecond)
		os.WriteFile(filepath.Join(sys, name, "size"), []byte("2048\n"), 0o644)
	}()
	h := newHarness(t, func(c *Config) { c.SysBlock = sys })
	r, err := h.client.BlockDevice(context.Background(), &protocol.BlockDeviceRequest{Serial: "cube-slot-3", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if r.Device != dev || r.Major != unix.Major(st.Rdev) || r.Minor != unix.Minor(st.Rdev) || r.SizeBytes != 1<<20 {
		t.Errorf("BlockDevice = %+v; want %s %d:%d, %d bytes", r, dev, unix.Major(st.Rdev), unix.Minor(st.Rdev), 1<<20)
	}
}
