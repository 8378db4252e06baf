package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysBlock is a /sys/block as sysfs lays it out: each entry a link to
// its device's directory, which holds the serial.
type fakeSysBlock struct {
	t               *testing.T
	root, blk, devs string
}

func newFakeSysBlock(t *testing.T) *fakeSysBlock {
	root := t.TempDir()
	f := &fakeSysBlock{t: t, root: root, blk: filepath.Join(root, "block"), devs: t.TempDir()}
	if err := os.MkdirAll(f.blk, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// plug makes device addr with serial and links block device name to it
// (replacing the link name had).
func (f *fakeSysBlock) plug(name, addr, serial string) {
	f.t.Helper()
	dir := filepath.Join(f.root, "devices", addr, "block", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "serial"), []byte(serial+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
	link := filepath.Join(f.blk, name)
	os.Remove(link)
	if err := os.Symlink(filepath.Join("..", "devices", addr, "block", name), link); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.devs, name), nil, 0o600); err != nil { // the node devtmpfs makes
		f.t.Fatal(err)
	}
}

// TestFindDiskCache: findDisk keeps the serial → device mapping of its last
// scan and, for a kept entry, checks only the device's sysfs link (reading
// a virtio-blk serial is a request to the device); it scans again when the
// link changed or the serial is unknown.
func TestFindDiskCache(t *testing.T) {
	f := newFakeSysBlock(t)
	f.plug("vda", "virtio1", "cube-slot-0")
	f.plug("vdb", "virtio2", "cube-slot-1")
	h := newHarness(t, func(c *Config) { c.SysBlock, c.DevDir = f.blk, f.devs })
	s := h.svc
	s.warmDisks()
	if got := s.diskNames["cube-slot-1"].name; got != "vdb" {
		t.Fatalf("after warmDisks, cube-slot-1 → %q, want vdb (%v)", got, s.diskNames)
	}
	// A kept entry is used without reading its serial (made unreadable
	// here) and without a scan (a device added since is not seen).
	serial0 := filepath.Join(f.root, "devices", "virtio1", "block", "vda", "serial")
	if err := os.Remove(serial0); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(serial0, 0o755); err != nil {
		t.Fatal(err)
	}
	f.plug("vdc", "virtio3", "cube-slot-2")
	if dev, err := s.findDisk("cube-slot-0"); err != nil || dev != filepath.Join(f.devs, "vda") {
		t.Fatalf("findDisk(cube-slot-0) = %q, %v", dev, err)
	}
	if _, ok := s.diskNames["cube-slot-2"]; ok {
		t.Fatalf("a cached lookup scanned: %v", s.diskNames)
	}
	// Unknown serial: one scan finds it.
	if dev, err := s.findDisk("cube-slot-2"); err != nil || dev != filepath.Join(f.devs, "vdc") {
		t.Fatalf("findDisk(cube-slot-2) = %q, %v", dev, err)
	}
	// The name now links to another device (hot-plugged), and the serial is
	// on a new name: the lookup scans again and finds it there.
	f.plug("vda", "virtio4", "other")
	f.plug("vdd", "virtio5", "cube-slot-0")
	if dev, err := s.findDisk("cube-slot-0"); err != nil || dev != filepath.Join(f.devs, "vdd") {
		t.Fatalf("findDisk(cube-slot-0) after it moved = %q, %v", dev, err)
	}
	// Gone everywhere: not found, naming the devices there are, and the
	// stale entry dropped.
	if err := os.Remove(filepath.Join(f.blk, "vdd")); err != nil {
		t.Fatal(err)
	}
	_, err := s.findDisk("cube-slot-0")
	if err == nil || !strings.Contains(err.Error(), `no block device with serial "cube-slot-0"`) || !strings.Contains(err.Error(), "vda, vdb, vdc") {
		t.Fatalf("findDisk of a serial no device has: %v", err)
	}
	if _, ok := s.diskNames["cube-slot-0"]; ok {
		t.Fatalf("a failed lookup kept the stale entry: %v", s.diskNames)
	}
}

// TestFindDiskPlainDirs: where SysBlock's entries are directories, not
// links, a kept entry is checked by its serial: a changed serial is seen.
func TestFindDiskPlainDirs(t *testing.T) {
	sys, devs := t.TempDir(), t.TempDir()
	set := func(name, serial string) {
		t.Helper()
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		if err := os.WriteFile(filepath.Join(sys, name, "serial"), []byte(serial+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(devs, name), nil, 0o600)
	}
	set("vda", "s0")
	h := newHarness(t, func(c *Config) { c.SysBlock, c.DevDir = sys, devs })
	if dev, err := h.svc.findDisk("s0"); err != nil || dev != filepath.Join(devs, "vda") {
		t.Fatalf("findDisk(s0) = %q, %v", dev, err)
	}
	set("vda", "s1")
	set("vdb", "s0")
	if dev, err := h.svc.findDisk("s0"); err != nil || dev != filepath.Join(devs, "vdb") {
		t.Fatalf("findDisk(s0) after its serial moved = %q, %v", dev, err)
	}
}
