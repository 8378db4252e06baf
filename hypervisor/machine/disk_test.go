package machine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
)

func writeFile(t *testing.T, dir, name string, size int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Repeat([]byte{0x5A}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSetDisk: a drive slot re-pointed at another file (the shim's pod
// path) is what snapshots record; rollback refuses to overwrite a file the
// slot was re-pointed at; errors change nothing.
func TestSetDisk(t *testing.T) {
	dir := t.TempDir()
	stub := writeFile(t, dir, "slot-1.img", 4096)
	image := writeFile(t, dir, "rootfs.img", 1<<20)
	var cons bytes.Buffer
	m := newMachineTB(t, counterCode, 1, &cons)
	dev, err := blk.Open(blk.Options{Path: stub, Serial: "cube-slot-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := m.AddVirtio(dev, 0x01, 0x80); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 1000)

	before := filepath.Join(dir, "before")
	if _, err := m.Snapshot(before, SnapshotOptions{Components: snapshot.Components{VMMVersion: "test"}}); err != nil {
		t.Fatal(err)
	}

	if _, err := m.SetDisk("cube-slot-9", image); !errors.Is(err, ErrNoDisk) {
		t.Errorf("unknown serial: %v, want ErrNoDisk", err)
	}
	if _, err := m.SetDisk("", image); err == nil {
		t.Error("empty serial accepted")
	}
	if _, err := m.SetDisk("cube-slot-1", filepath.Join(dir, "missing.img")); err == nil {
		t.Error("missing file accepted")
	}
	if dev.Path() != stub {
		t.Fatalf("failed SetDisk changed the path to %s", dev.Path())
	}

	sectors, err := m.SetDisk("cube-slot-1", image)
	if err != nil {
		t.Fatal(err)
	}
	if sectors != (1<<20)/blk.SectorSize || dev.Sectors() != sectors || dev.Path() != image {
		t.Errorf("after SetDisk: %d sectors (device %d), path %s", sectors, dev.Sectors(), dev.Path())
	}
	if m.State() != Running {
		t.Errorf("SetDisk left the machine %v", m.State())
	}

	// A snapshot now records the image, in the manifest and the device state.
	after := filepath.Join(dir, "after")
	if _, err := m.Snapshot(after, SnapshotOptions{Components: snapshot.Components{VMMVersion: "test"}}); err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.Open(after)
	if err != nil {
		t.Fatal(err)
	}
	if d := snap.Manifest.Shape.Disks[0]; d.Source != image || d.Size != 1<<20 {
		t.Errorf("manifest disk %+v, want source %s size %d", d, image, 1<<20)
	}
	s, err := m.decodeState(snap.State)
	if err != nil {
		t.Fatal(err)
	}
	var b blk.State
	if err := snapshot.Load(s.Devices[0].State, &b); err != nil || b.Path != image || b.Sectors != sectors {
		t.Errorf("device state %+v (%v), want path %s", b, err, image)
	}

	// Rolling back to the snapshot taken with the stub would write the
	// stub's copy over the image: refused, nothing changed.
	old, err := snapshot.Open(before)
	if err != nil {
		t.Fatal(err)
	}
	imgBefore, _ := os.ReadFile(image)
	if _, err := m.Rollback(old); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("rollback across a re-pointed disk: %v, want ErrMismatch", err)
	}
	if b, _ := os.ReadFile(image); !bytes.Equal(b, imgBefore) {
		t.Error("refused rollback changed the image")
	}
	if m.State() != Running {
		t.Errorf("refused rollback left the machine %v", m.State())
	}
	// Back at the stub, the rollback goes through.
	if _, err := m.SetDisk("cube-slot-1", stub); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rollback(old); err != nil {
		t.Errorf("rollback with the slot back on its stub: %v", err)
	}

	m.Stop()
	if _, err := m.SetDisk("cube-slot-1", image); err == nil {
		t.Error("SetDisk on a stopped machine accepted")
	}
}
