package blk_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
	"github.com/cube-runtime/cube/hypervisor/virtio/virtiotest"
)

// writeImage writes n sectors, each filled with fill+its index.
func writeImage(t *testing.T, name string, n int, fill byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	img := make([]byte, n*blk.SectorSize)
	for i := range img {
		img[i] = fill + byte(i/blk.SectorSize)
	}
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func configGen(d *virtiotest.Driver) uint64 { return d.Read(virtio.CommonOffset+0x15, 1) }

func TestSetBackingMediaChange(t *testing.T) {
	d, dev, oldPath := newDisk(t, false)
	gen := configGen(d)
	cfgIntr := virtiotest.VectorData(d.ConfigVector())
	newPath := writeImage(t, "new.img", 200, 0x40)

	n, err := dev.SetBacking(newPath)
	if err != nil {
		t.Fatal(err)
	}
	if n != 200 || dev.Sectors() != 200 {
		t.Errorf("capacity after swap: returned %d, Sectors %d, want 200", n, dev.Sectors())
	}
	if got := binary.LittleEndian.Uint64(d.DeviceConfig(0, 8)); got != 200 {
		t.Errorf("config capacity %d, want 200", got)
	}
	if g := configGen(d); g == gen {
		t.Errorf("config generation still %d after a media change", g)
	}
	if c := d.MSI.Count(cfgIntr); c != 1 {
		t.Errorf("%d config-change interrupts, want 1", c)
	}
	if dev.Path() != newPath || dev.OpenedPath() != oldPath {
		t.Errorf("Path %q OpenedPath %q, want %q and %q", dev.Path(), dev.OpenedPath(), newPath, oldPath)
	}
	if s := dev.State(); s.Path != newPath || s.Sectors != 200 {
		t.Errorf("state %+v does not record the new backing file", s)
	}

	// Reads come from the new file, including sectors beyond the old capacity.
	st, buf := request(d, blk.TypeIn, 150, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != byte(0x40+150) {
		t.Errorf("read after swap: status %d data %#x", status(d, st), d.Mem.Bytes(buf, 1)[0])
	}
	// Writes go to the new file; the old one is untouched.
	before, _ := os.ReadFile(oldPath)
	payload := bytes.Repeat([]byte{0xEE}, 512)
	st, _ = request(d, blk.TypeOut, 3, payload, 0, false)
	if status(d, st) != blk.StatusOK {
		t.Fatalf("write after swap: status %d", status(d, st))
	}
	if b, _ := os.ReadFile(newPath); !bytes.Equal(b[3*512:4*512], payload) {
		t.Error("write did not reach the new backing file")
	}
	if after, _ := os.ReadFile(oldPath); !bytes.Equal(before, after) {
		t.Error("write after swap changed the old backing file")
	}

	// Back to a smaller file: the capacity shrinks and old offsets fail.
	if _, err := dev.SetBacking(oldPath); err != nil {
		t.Fatal(err)
	}
	if dev.Sectors() != sectors {
		t.Errorf("capacity %d after swapping back, want %d", dev.Sectors(), sectors)
	}
	st, _ = request(d, blk.TypeIn, 150, nil, 512, false)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("read beyond the shrunk capacity: status %d, want IOERR", s)
	}
	if c := d.MSI.Count(cfgIntr); c != 2 {
		t.Errorf("%d config-change interrupts after two swaps, want 2", c)
	}
}

func TestSetBackingErrorsKeepTheOldFile(t *testing.T) {
	d, dev, path := newDisk(t, false)
	cfgIntr := virtiotest.VectorData(d.ConfigVector())
	roFile := writeImage(t, "ro.img", 8, 0)
	if err := os.Chmod(roFile, 0o444); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]string{
		"empty path":   "",
		"missing file": filepath.Join(t.TempDir(), "nope.img"),
		"directory":    t.TempDir(),
		"fifo":         mkfifo(t),
	} {
		if _, err := dev.SetBacking(p); err == nil {
			t.Errorf("%s: SetBacking(%q) accepted", name, p)
		}
	}
	// A writable disk opens its new file read-write: a file the VMM may
	// only read is refused (root bypasses mode bits, so only as non-root).
	if os.Geteuid() != 0 {
		if _, err := dev.SetBacking(roFile); err == nil {
			t.Error("writable disk accepted a read-only file")
		}
	}
	if dev.Path() != path || dev.Sectors() != sectors {
		t.Errorf("after failed swaps: path %q sectors %d, want %q %d", dev.Path(), dev.Sectors(), path, sectors)
	}
	if c := d.MSI.Count(cfgIntr); c != 0 {
		t.Errorf("%d config-change interrupts from failed swaps", c)
	}
	st, buf := request(d, blk.TypeIn, 5, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != 5 {
		t.Error("old backing file no longer served after failed swaps")
	}
}

func TestSetBackingReadOnlyDisk(t *testing.T) {
	d, dev, _ := newDisk(t, true)
	roFile := writeImage(t, "ro.img", 16, 0x80)
	if err := os.Chmod(roFile, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.SetBacking(roFile); err != nil {
		t.Fatalf("read-only disk refused a read-only file: %v", err)
	}
	before, _ := os.ReadFile(roFile)
	st, _ := request(d, blk.TypeOut, 0, make([]byte, 512), 0, false)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("write to the read-only disk's new file: status %d", s)
	}
	if after, _ := os.ReadFile(roFile); !bytes.Equal(before, after) {
		t.Error("read-only disk's new file changed")
	}
	st, buf := request(d, blk.TypeIn, 2, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != 0x82 {
		t.Error("read from the read-only disk's new file failed")
	}
	d.Write(virtio.CommonOffset+0x08, 4, 0) // driver_feature_select = 0
	if d.Read(virtio.CommonOffset+0x0C, 4)&blk.FRO == 0 {
		t.Error("RO feature lost")
	}
}

// Before the driver activates the device there is no one to interrupt; the
// capacity is simply what the driver will read at probe.
func TestSetBackingBeforeActivation(t *testing.T) {
	path := writeImage(t, "a.img", 8, 0)
	dev, err := blk.Open(blk.Options{Path: path, Serial: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := dev.SetBacking(writeImage(t, "b.img", 32, 0)); err != nil {
		t.Fatal(err)
	}
	var cfg [8]byte
	dev.ReadConfig(0, cfg[:])
	if got := binary.LittleEndian.Uint64(cfg[:]); got != 32 {
		t.Errorf("capacity %d, want 32", got)
	}
	// Restore compares against the current capacity.
	s := dev.State()
	if err := dev.Restore(s); err != nil {
		t.Errorf("restore of its own state: %v", err)
	}
}

func mkfifo(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	return p
}

// TestSetBackingModeReadOnly: a read-write slot given a read-only medium
// (disk-set read_only: a raw block volume with permissions "r") fails
// writes with IOERR and leaves the file unchanged; reads work; the next
// read-write SetBacking accepts writes again.
func TestSetBackingModeReadOnly(t *testing.T) {
	d, dev, _ := newDisk(t, false)
	roPath := writeImage(t, "ro.img", 16, 0x10)
	if err := os.Chmod(roPath, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.SetBackingMode(roPath, true); err != nil {
		t.Fatalf("read-only medium over a 0444 file: %v", err)
	}
	before, _ := os.ReadFile(roPath)
	st, _ := request(d, blk.TypeOut, 0, make([]byte, 512), 0, false)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("write to read-only medium: status %d, want IOERR", s)
	}
	if after, _ := os.ReadFile(roPath); !bytes.Equal(before, after) {
		t.Error("read-only medium changed")
	}
	st, buf := request(d, blk.TypeIn, 2, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != 0x12 {
		t.Error("read from read-only medium failed")
	}
	rwPath := writeImage(t, "rw.img", 16, 0x20)
	if _, err := dev.SetBackingMode(rwPath, false); err != nil {
		t.Fatal(err)
	}
	st, _ = request(d, blk.TypeOut, 0, bytes.Repeat([]byte{0xab}, 512), 0, false)
	if s := status(d, st); s != blk.StatusOK {
		t.Errorf("write after re-pointing read-write: status %d", s)
	}
}

// TestSetBackingBlockDevice: a host block device (a read-only loop device
// over a file) as a slot's medium: its capacity is the device's size, a
// read-only medium refuses writes, and ReplaceBacking (rollback) reopens it
// read-only (the device refuses O_RDWR even to root). Needs root and
// losetup; skipped otherwise.
func TestSetBackingBlockDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a loop device")
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("no losetup")
	}
	img := writeImage(t, "loop.img", 64, 0x30)
	out, err := exec.Command(losetup, "--read-only", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command(losetup, "-d", loop).Run() })

	d, dev, _ := newDisk(t, false)
	n, err := dev.SetBackingMode(loop, true)
	if err != nil || n != 64 {
		t.Fatalf("loop device medium: %d sectors, %v; want 64", n, err)
	}
	st, buf := request(d, blk.TypeIn, 3, nil, 512, false)
	if status(d, st) != blk.StatusOK || d.Mem.Bytes(buf, 1)[0] != 0x33 {
		t.Error("read from the loop device failed")
	}
	st, _ = request(d, blk.TypeOut, 0, make([]byte, 512), 0, false)
	if s := status(d, st); s != blk.StatusIOErr {
		t.Errorf("write to a read-only loop medium: status %d, want IOERR", s)
	}
	if err := dev.ReplaceBacking(); err != nil {
		t.Fatalf("ReplaceBacking of a read-only medium: %v", err)
	}
	if modes := openModes(t, loop); len(modes) != 1 || modes[0] != syscall.O_RDONLY {
		t.Errorf("after ReplaceBacking this process holds %s open with access modes %v, want one O_RDONLY", loop, modes)
	}
}

// openModes returns the access mode (O_RDONLY, O_WRONLY, O_RDWR) of every
// descriptor of this process open on path, read from /proc/self/fdinfo.
func openModes(t *testing.T, path string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var modes []int
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || target != path {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				if err != nil {
					t.Fatalf("fdinfo %s: %q: %v", e.Name(), line, err)
				}
				modes = append(modes, int(flags)&syscall.O_ACCMODE)
			}
		}
	}
	return modes
}
