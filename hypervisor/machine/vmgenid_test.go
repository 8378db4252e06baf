package machine

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/boot"
	"github.com/cube-runtime/cube/hypervisor/devices/vmgenid"
	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// guestID is the generation id in guest memory, checked against the
// device's.
func guestID(t *testing.T, m *Machine) [vmgenid.Size]byte {
	t.Helper()
	var id [vmgenid.Size]byte
	if _, err := m.Memory().ReadAt(id[:], boot.VMGenIDAddr); err != nil {
		t.Fatal(err)
	}
	if id != m.genid.ID() {
		t.Fatalf("guest memory holds id %x, the device %x", id, m.genid.ID())
	}
	if id == [vmgenid.Size]byte{} {
		t.Fatal("the generation id is zero")
	}
	return id
}

// TestVMGenIDNewGeneration: a machine with the device has an id at boot;
// every restore of one snapshot, and an in-place rollback, give a new one
// (in guest memory and in the state the next snapshot saves); the page is
// in the next incremental snapshot; a snapshot with the device does not
// restore into a machine without it.
func TestVMGenIDNewGeneration(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kernel")
	if err := os.WriteFile(p, kvmtest.SyntheticBzImage(counterCode), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Kernel: p, Cmdline: "console=ttyS0", MemoryMiB: 64, VCPUs: 1, VMGenID: true})
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("no KVM device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	booted := guestID(t, m)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 100)
	m.Pause()
	base := t.TempDir()
	full := filepath.Join(base, "full")
	if _, err := m.Snapshot(full, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if guestID(t, m) != booted {
		t.Fatal("a snapshot changed the id of the VM it was taken of")
	}
	snap, err := snapshot.Open(full)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[vmgenid.Size]byte]string{booted: "boot"}
	fresh := func(what string, id [vmgenid.Size]byte) {
		t.Helper()
		if prev, ok := seen[id]; ok {
			t.Errorf("%s: id %x, the same as after %s", what, id, prev)
		}
		seen[id] = what
	}

	for _, what := range []string{"restore 1", "restore 2"} {
		r, err := Restore(snap, Config{VMGenID: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fresh(what, guestID(t, r))
		r.Close()
	}
	if _, err := Restore(snap, Config{}, nil); !errors.Is(err, snapshot.ErrMismatch) {
		t.Errorf("restore of a snapshot with the device into a machine without: %v, want ErrMismatch", err)
	}

	if _, err := m.Rollback(snap); err != nil {
		t.Fatal(err)
	}
	rolled := guestID(t, m)
	fresh("rollback", rolled)
	diff := filepath.Join(base, "diff")
	if _, err := m.Snapshot(diff, SnapshotOptions{Incremental: true}); err != nil {
		t.Fatal(err)
	}
	d, err := snapshot.Open(diff)
	if err != nil {
		t.Fatal(err)
	}
	bm, err := d.Bitmap(len(d.Manifest.Memory) - 1)
	if err != nil {
		t.Fatal(err)
	}
	if page := uint64(boot.VMGenIDAddr / memory.PageSize); bm[page/64]&(1<<(page%64)) == 0 {
		t.Error("the incremental snapshot after a rollback lacks the page of the new generation id")
	}
	s, err := snapshot.DecodePayload(d.State)
	if err != nil {
		t.Fatal(err)
	}
	var st vmgenid.State
	if err := snapshot.Load(s.VMGenID, &st); err != nil {
		t.Fatal(err)
	}
	if want := m.genid.State(); st != want {
		t.Errorf("saved state %+v, the device's %+v", st, want)
	}
	r, err := Restore(d, Config{VMGenID: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fresh("restore of the incremental snapshot", guestID(t, r))
}

// TestVMGenIDAbsentByDefault: without the option the machine has no id
// device and its snapshot state none.
func TestVMGenIDAbsentByDefault(t *testing.T) {
	m := startCounter(t)
	if m.genid != nil {
		t.Fatal("machine without VMGenID has the device")
	}
	m.Pause()
	s, err := m.captureState()
	if err != nil {
		t.Fatal(err)
	}
	if s.VMGenID != nil {
		t.Errorf("state of a machine without the device has %s", s.VMGenID)
	}
}
