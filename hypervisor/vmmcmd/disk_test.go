package vmmcmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// TestDiskSetOp drives cube-vmm's disk-set control op: a drive slot is
// re-pointed at a larger image (the shim's pod path), errors leave it
// alone, a read-only drive stays read-only, and a snapshot taken after
// the swap records the image and restores onto a copy of it.
func TestDiskSetOp(t *testing.T) {
	needKVM(t)
	dir := t.TempDir()
	write := func(name string, size int, fill byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{fill}, size), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stub := write("slot-1.img", 4096, 0)
	roStub := write("ro-stub.img", 4096, 0)
	image := write("rootfs.img", 1<<20, 0x11)
	sock := filepath.Join(dir, "ctl")
	v := startVMM(t, sock, "-kernel", kernel(t, counterCode), "-memory", "64", "-console", "none", "-control", sock,
		"-disk", stub+",serial=cube-slot-1", "-disk", roStub+",ro,serial=ro-slot", "-rng=false")

	res, err := v.ctl.SetDisk(t.Context(), "cube-slot-1", image)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sectors != (1<<20)/512 || res.Path != image {
		t.Errorf("disk-set result %+v", res)
	}
	for _, tc := range []struct{ serial, path, want string }{
		{"cube-slot-7", image, "no such disk"},
		{"cube-slot-1", filepath.Join(dir, "missing.img"), "no such file"},
		{"cube-slot-1", dir, "is a directory"},
		{"cube-slot-1", "rootfs.img", "not absolute"},
	} {
		if _, err := v.ctl.SetDisk(t.Context(), tc.serial, tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("disk-set %s %s: %v, want %q", tc.serial, tc.path, err, tc.want)
		}
	}
	// A read-only drive takes a read-only file (opened O_RDONLY: the VMM
	// never needs write access to it).
	roImage := write("ro.img", 8192, 0x22)
	if err := os.Chmod(roImage, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := v.ctl.SetDisk(t.Context(), "ro-slot", roImage); err != nil {
		t.Errorf("read-only drive refused a read-only file: %v", err)
	}

	snap := filepath.Join(dir, "snap")
	if _, err := v.ctl.Snapshot(t.Context(), snap, false); err != nil {
		t.Fatal(err)
	}
	v.stop(t)
	s, err := snapshot.Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Manifest.Shape.Disks; len(d) != 2 || d[0].Source != image || d[0].Size != 1<<20 || d[1].Source != roImage || !d[1].ReadOnly {
		t.Errorf("manifest disks %+v, want the re-pointed files", d)
	}
	var cfg Config
	if err := json.Unmarshal(s.Manifest.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Disks[0].Path != image || cfg.Disks[1].Path != roImage || !cfg.Disks[1].ReadOnly {
		t.Errorf("snapshot configuration disks %+v, want the re-pointed files", cfg.Disks)
	}
	// Restore attaches a working copy of the image (in -disk-dir) with the
	// capacity the guest's driver has cached.
	rdir := filepath.Join(dir, "restored")
	if err := os.Mkdir(rdir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := startVMM(t, sock, "restore", "-disk-dir", rdir, snap)
	if b, err := os.ReadFile(filepath.Join(rdir, "rootfs.img")); err != nil || len(b) != 1<<20 || b[0] != 0x11 {
		t.Errorf("restored working copy of the image: %d bytes, %v", len(b), err)
	}
	if _, err := r.ctl.SetDisk(t.Context(), "cube-slot-1", stub); err != nil {
		t.Errorf("disk-set in a restored VM: %v", err)
	}
	r.stop(t)
}
