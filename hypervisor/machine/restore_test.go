package machine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/rng"
)

// attachRNG is the restore attach of the machines rngSnapshot snapshots.
func attachRNG(m *Machine) error {
	_, err := m.AddVirtio(rng.New(), 0xff, 0x00)
	return err
}

// rngSnapshot snapshots a paused counter guest with a virtio-rng device
// (its transport and device state are in the snapshot) and returns the
// snapshot directory.
func rngSnapshot(t testing.TB) string {
	t.Helper()
	var cons bytes.Buffer
	m := newMachineTB(t, counterCode, 1, &cons)
	if err := attachRNG(m); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 100)
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if _, err := m.Snapshot(dir, SnapshotOptions{Components: snapshot.Components{KernelSHA256: "k", VMMVersion: "test"}}); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	return dir
}

// leftovers describes what of a restore remains in this process: open
// descriptors (as a count) and mappings of files under dir.
type leftovers struct {
	fds  int
	maps []string
}

func leftoversOf(t testing.TB, dir string) leftovers {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	l := leftovers{fds: len(fds)}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.Contains(line, dir) {
			l.maps = append(l.maps, line)
		}
	}
	return l
}

func (l leftovers) same(o leftovers) bool { return l.fds == o.fds && len(l.maps) == len(o.maps) }

// restoreAndClose restores snap (into a prepared VM if prepared), closes the
// machine if that succeeded, and fails t if anything of it remains.
func restoreAndClose(t testing.TB, snap *snapshot.Snapshot, cfg Config, prepared bool) error {
	t.Helper()
	before := leftoversOf(t, filepath.Dir(snap.Dir))
	if prepared {
		p, err := PrepareVM(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Prepared = p
	}
	m, err := Restore(snap, cfg, attachRNG)
	if err == nil {
		if m == nil {
			t.Fatal("Restore returned neither a machine nor an error")
		}
		m.Close()
	} else if m != nil {
		t.Errorf("Restore failed (%v) and returned a machine", err)
	}
	if after := leftoversOf(t, filepath.Dir(snap.Dir)); !after.same(before) {
		t.Errorf("restore (err %v) left %d descriptors open (%d before) and mappings %q", err, after.fds, before.fds, after.maps)
	}
	return err
}

// editQueue edits queue 0 of a device record's transport state.
func editQueue(t testing.TB, d *snapshot.DeviceState, edit func(*virtio.QueueState)) {
	t.Helper()
	var ts virtio.TransportState
	if err := snapshot.Load(d.Transport, &ts); err != nil {
		t.Fatal(err)
	}
	edit(&ts.Queues[0])
	b, err := snapshot.Save(ts)
	if err != nil {
		t.Fatal(err)
	}
	d.Transport = b
}

// editSnapshot makes a copy of the snapshot in dir (memory and disk files
// hard-linked: restore never writes them) with its state payload and
// manifest edited, in that order: a manifest edit sees the state's size.
func editSnapshot(t testing.TB, dir string, editState func(*snapshot.State) []byte, editManifest func(*snapshot.Manifest)) string {
	t.Helper()
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "edited")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n != snapshot.ManifestName && n != snapshot.StateName {
			if err := os.Link(filepath.Join(dir, n), filepath.Join(out, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	payload := snap.State
	if editState != nil {
		s, err := snapshot.DecodePayload(payload)
		if err != nil {
			t.Fatal(err)
		}
		if payload = editState(s); payload == nil {
			if payload, err = snapshot.EncodePayload(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	state, err := snapshot.EncodeState(payload)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, snapshot.StateName), state, 0o600); err != nil {
		t.Fatal(err)
	}
	man := *snap.Manifest
	man.Memory = append([]snapshot.MemoryLayer(nil), man.Memory...)
	man.State.Size = int64(len(state))
	if editManifest != nil {
		editManifest(&man)
	}
	b, err := json.MarshalIndent(&man, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, snapshot.ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRestoreRefusals: snapshots whose manifest, layer files and saved state
// disagree are refused, by Open where the files alone show it, else by
// Restore once the machine exists; either way with the reason's class, and a
// failed Restore (launched or into a prepared VM) leaves nothing behind.
func TestRestoreRefusals(t *testing.T) {
	dir := rngSnapshot(t)
	const mib = 1 << 20
	cases := []struct {
		name     string
		state    func(*snapshot.State) []byte
		manifest func(*snapshot.Manifest)
		memory   int64 // memory.bin of this size instead of the snapshot's
		openErr  error // Open refuses with this
		err      error // else Restore fails with this
	}{
		{name: "shape memory differs from the layer's size",
			manifest: func(m *snapshot.Manifest) { m.Shape.MemoryMiB = 128 }, openErr: snapshot.ErrCorrupt},
		{name: "layer size differs from its file",
			manifest: func(m *snapshot.Manifest) { m.Memory[0].Size = 128 * mib }, openErr: snapshot.ErrCorrupt},
		{name: "self-consistent manifest, file of another size",
			manifest: func(m *snapshot.Manifest) { m.Shape.MemoryMiB, m.Memory[0].Size = 128, 128*mib }, openErr: snapshot.ErrTruncated},
		{name: "state size differs from its file",
			manifest: func(m *snapshot.Manifest) { m.State.Size++ }, openErr: snapshot.ErrTruncated},
		{name: "memory layer missing",
			manifest: func(m *snapshot.Manifest) { m.Memory[0].File = "gone.bin" }, openErr: fs.ErrNotExist},
		{name: "shape has more vCPUs than the state",
			manifest: func(m *snapshot.Manifest) { m.Shape.VCPUs = 2 }, err: snapshot.ErrMismatch},
		{name: "self-consistent manifest for a smaller VM than the state's queues",
			state: func(s *snapshot.State) []byte {
				editQueue(t, &s.Devices[0], func(q *virtio.QueueState) {
					q.Ready, q.Size, q.Desc, q.Avail, q.Used = true, 64, 80*mib, 80*mib+0x400, 80*mib+0x1000
				})
				return nil
			}, err: snapshot.ErrCorrupt},
		{name: "state without vCPUs",
			state: func(s *snapshot.State) []byte { s.VCPUs = nil; return nil }, err: snapshot.ErrMismatch},
		{name: "state of another version",
			state: func(s *snapshot.State) []byte { s.Version++; return nil }, err: snapshot.ErrVersion},
		{name: "state with a short XSAVE area",
			state: func(s *snapshot.State) []byte { s.VCPUs[0].XSave = s.VCPUs[0].XSave[:100]; return nil }, err: snapshot.ErrCorrupt},
		{name: "state with another device",
			state: func(s *snapshot.State) []byte { s.Devices[0].Kind = "vsock"; return nil }, err: snapshot.ErrMismatch},
		{name: "state without the device's own state",
			state: func(s *snapshot.State) []byte { s.Devices[0].State = nil; return nil }, err: snapshot.ErrCorrupt},
		{name: "state that is not JSON",
			state: func(*snapshot.State) []byte { return []byte("{not json") }, err: snapshot.ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			edited := editSnapshot(t, dir, c.state, c.manifest)
			snap, err := snapshot.Open(edited)
			if c.openErr != nil {
				if !errors.Is(err, c.openErr) {
					t.Fatalf("Open: %v, want %v", err, c.openErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			for _, prepared := range []bool{false, true} {
				err := restoreAndClose(t, snap, Config{}, prepared)
				if !errors.Is(err, c.err) || !strings.Contains(err.Error(), edited) {
					t.Errorf("prepared=%v: Restore: %v, want %v naming %s", prepared, err, c.err, edited)
				}
				t.Logf("prepared=%v: %v", prepared, err)
			}
		})
	}
}

// TestRestoreFailsAfterTheMachineExists: a restore failing in KVM (no such
// device), in attach, or on layer files changed since Open returns the
// reason and leaves nothing behind, launched or into a prepared VM; the
// untouched snapshot then restores (the failures changed nothing).
func TestRestoreFailsAfterTheMachineExists(t *testing.T) {
	dir := rngSnapshot(t)
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = restoreAndClose(t, snap, Config{KVMDevice: "/nonexistent/kvm"}, false)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "/nonexistent/kvm") {
		t.Errorf("restore on a missing KVM device: %v", err)
	}
	boom := errors.New("attach failed")
	for _, prepared := range []bool{false, true} {
		before := leftoversOf(t, filepath.Dir(dir))
		cfg := Config{}
		if prepared {
			if cfg.Prepared, err = PrepareVM(Config{}); err != nil {
				t.Fatal(err)
			}
		}
		m, err := Restore(snap, cfg, func(m *Machine) error {
			if err := attachRNG(m); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || m != nil {
			t.Errorf("prepared=%v: restore with a failing attach: %v, %v", prepared, m, err)
		}
		if after := leftoversOf(t, filepath.Dir(dir)); !after.same(before) {
			t.Errorf("prepared=%v: a failed attach left %+v (before %+v)", prepared, after, before)
		}
	}
	// The memory file truncated after Open: mapping it would fault later.
	short := editSnapshot(t, dir, nil, nil)
	ssnap, err := snapshot.Open(short)
	if err != nil {
		t.Fatal(err)
	}
	mem := ssnap.Path(snapshot.MemoryName)
	if err := os.Remove(mem); err != nil { // a hard link: the snapshot's own file stays
		t.Fatal(err)
	}
	if err := os.WriteFile(mem, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(mem, ssnap.Manifest.Memory[0].Size/2); err != nil {
		t.Fatal(err)
	}
	if err := restoreAndClose(t, ssnap, Config{}, true); !errors.Is(err, snapshot.ErrTruncated) {
		t.Errorf("restore of a memory file truncated after Open: %v", err)
	}
	for _, prepared := range []bool{false, true} {
		if err := restoreAndClose(t, snap, Config{}, prepared); err != nil {
			t.Errorf("prepared=%v: restore after the failures: %v", prepared, err)
		}
	}
}

// TestNewFailsCleanly: a boot failing after the machine was allocated (no
// KVM device) returns the reason instead of releasing a nil machine.
func TestNewFailsCleanly(t *testing.T) {
	m, err := New(Config{Kernel: synthKernel(t, counterCode), KVMDevice: "/nonexistent/kvm"})
	if !errors.Is(err, fs.ErrNotExist) || m != nil {
		t.Fatalf("New on a missing KVM device: %v, %v", m, err)
	}
}

// tickerCode writes '.' to COM1 every 4096 iterations of a loop, forever.
var tickerCode = kvmtest.TickerProgram('.')

// TestRestoreConsole: a restored guest's serial output reaches the
// restore's Config.Console.
func TestRestoreConsole(t *testing.T) {
	var before syncBuffer
	m, err := New(Config{Kernel: synthKernel(t, tickerCode), MemoryMiB: 64, Console: &before})
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no KVM device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, &before)
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if _, err := m.Snapshot(dir, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var after syncBuffer
	r, err := Restore(snap, Config{Console: &after}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.StartRestored(false); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, &after)
}

// syncBuffer is a console the test reads while vCPU threads write it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitConsole waits until the console shows the ticker guest's dots.
func waitConsole(t testing.TB, cons fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(cons.String(), "...") {
		if time.Now().After(deadline) {
			t.Fatalf("console %q: the guest's output never came", cons.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
