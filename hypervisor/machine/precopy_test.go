package machine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Where the sweep guest writes: one store into each page of
// [sweepStart, sweepEnd), again and again; counterAddr counts the sweeps.
const (
	sweepStart = 0x1000000
	sweepEnd   = 0x2000000
)

// sweepCode stores the sweep number at the start of every page of 16 MiB,
// forever, and the number of sweeps begun at counterAddr: a guest that
// dirties memory all the time, as a pre-copy must cope with.
var sweepCode = []byte{
	0x48, 0x31, 0xc0, // xor rax, rax
	0x48, 0xff, 0xc0, // outer: inc rax
	0x48, 0xc7, 0xc3, 0x00, 0x00, 0x00, 0x01, // mov rbx, 0x1000000
	0x48, 0x89, 0x03, // inner: mov [rbx], rax
	0x48, 0x81, 0xc3, 0x00, 0x10, 0x00, 0x00, // add rbx, 0x1000
	0x48, 0x81, 0xfb, 0x00, 0x00, 0x00, 0x02, // cmp rbx, 0x2000000
	0x72, 0xed, // jb inner
	0x48, 0x89, 0x04, 0x25, 0x00, 0x00, 0x00, 0x03, // mov [0x3000000], rax
	0xeb, 0xd9, // jmp outer
}

func setHooks(t *testing.T, precopied func() error, frozen func()) {
	t.Helper()
	testHookPrecopied, testHookFrozen = precopied, frozen
	t.Cleanup(func() { testHookPrecopied, testHookFrozen = nil, nil })
}

// copyRAM copies all of guest memory, regions back to back.
func copyRAM(m *Machine) []byte {
	var out []byte
	for _, r := range m.mem.Regions() {
		out = append(out, r.Host...)
	}
	return out
}

// firstDiff describes where two memory images first differ.
func firstDiff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d bytes, want %d", len(got), len(want))
	}
	n := 0
	first := -1
	for p := 0; p < len(got); p += snapshot.PageSize {
		if !bytes.Equal(got[p:p+snapshot.PageSize], want[p:p+snapshot.PageSize]) {
			if first < 0 {
				first = p
			}
			n++
		}
	}
	if first < 0 {
		return "equal"
	}
	return fmt.Sprintf("%d pages differ, the first at %#x", n, first)
}

// readMemoryFile reads a full snapshot's memory file, holes as zeros.
func readMemoryFile(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, snapshot.MemoryName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPrecopySnapshot: a full snapshot of a running guest that keeps
// writing memory, while the VMM writes guest memory too (as devices do) and
// zeroes a page the pre-copy had written, holds exactly the guest's memory
// at the freeze; a restore from it comes back with that memory.
func TestPrecopySnapshot(t *testing.T) {
	var cons bytes.Buffer
	m := newMachine(t, sweepCode, 1, &cons)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 2)
	// A page the pre-copy writes non-zero and that is zero at the freeze:
	// the snapshot must not keep its old contents.
	const zeroed, devPage = 0x2800000, 0x2900000
	if _, err := m.Memory().WriteAt(bytes.Repeat([]byte{0x77}, 4096), zeroed); err != nil {
		t.Fatal(err)
	}
	var atFreeze []byte
	var sweepsAtPrecopy uint64
	setHooks(t, func() error {
		// The pre-copy is done: the guest sweeps twice more (all 4096 pages
		// of the sweep dirtied again), a device-side write lands on a page
		// the pre-copy wrote as a hole, another makes a page zero.
		sweepsAtPrecopy = counter(t, m)
		waitCounter(t, m, sweepsAtPrecopy+2)
		if _, err := m.Memory().WriteAt(bytes.Repeat([]byte{0xd5}, 3*4096), devPage); err != nil {
			return err
		}
		_, err := m.Memory().WriteAt(make([]byte, 4096), zeroed)
		return err
	}, func() { atFreeze = copyRAM(m) })

	dir := filepath.Join(t.TempDir(), "snap")
	st, err := m.Snapshot(dir, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %+v", st)
	if m.State() != Running {
		t.Fatalf("snapshot of a running VM left it %v", m.State())
	}
	if st.Precopy == 0 || st.RecopiedBytes < 4096*4096 {
		t.Errorf("precopy %v, %d bytes recopied: want a pre-copy and at least the 16 MiB the guest swept since", st.Precopy, st.RecopiedBytes)
	}
	if atFreeze == nil {
		t.Fatal("the frozen hook did not run")
	}
	if got := readMemoryFile(t, dir); !bytes.Equal(got, atFreeze) {
		t.Fatalf("memory file vs guest memory at the freeze: %s", firstDiff(got, atFreeze))
	}
	frozenSweeps := binary.LittleEndian.Uint64(atFreeze[counterAddr:])
	if frozenSweeps < sweepsAtPrecopy+2 {
		t.Fatalf("at the freeze the guest had swept %d times, want ≥ %d", frozenSweeps, sweepsAtPrecopy+2)
	}
	waitCounter(t, m, frozenSweeps+1) // it runs on
	m.Stop()

	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(snap, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := copyRAM(r); !bytes.Equal(got, atFreeze) {
		t.Fatalf("restored memory vs guest memory at the freeze: %s", firstDiff(got, atFreeze))
	}
	if err := r.StartRestored(false); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, r, frozenSweeps)
}

// TestPrecopyKeepsParent: a pre-copy clears the dirty record, but a full
// snapshot that then fails must leave the incremental chain intact: pages
// dirtied before the pre-copy are still in the next incremental snapshot.
// A VM paused during the pre-copy (Pause does not wait for it) is frozen
// paused and stays paused; a VM paused before takes the frozen path.
func TestPrecopyKeepsParent(t *testing.T) {
	var cons bytes.Buffer
	m := newMachine(t, sweepCode, 1, &cons)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 2)
	base := t.TempDir()
	if _, err := m.Snapshot(filepath.Join(base, "full"), SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	// Dirtied after the parent, before the failing snapshot's pre-copy.
	const page = 0x2a00000
	pattern := bytes.Repeat([]byte{0x3c}, 2*4096)
	if _, err := m.Memory().WriteAt(pattern, page); err != nil {
		t.Fatal(err)
	}
	setHooks(t, func() error { return errors.New("injected failure after the pre-copy") }, nil)
	st, err := m.Snapshot(filepath.Join(base, "failed"), SnapshotOptions{})
	if err == nil {
		t.Fatal("snapshot with an injected failure succeeded")
	}
	if st.Precopy == 0 {
		t.Fatalf("the failed snapshot did no pre-copy: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(base, "failed")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed snapshot left its directory: %v", err)
	}
	testHookPrecopied = nil
	inc := filepath.Join(base, "inc")
	if _, err := m.Snapshot(inc, SnapshotOptions{Incremental: true}); err != nil {
		t.Fatal(err)
	}

	// Paused while the pre-copy runs.
	var atFreeze []byte
	setHooks(t, m.Pause, func() { atFreeze = copyRAM(m) })
	dir := filepath.Join(base, "paused-during")
	st, err = m.Snapshot(dir, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.State() != Paused {
		t.Fatalf("VM paused during the pre-copy is %v after the snapshot", m.State())
	}
	if st.Precopy == 0 {
		t.Errorf("no pre-copy: %+v", st)
	}
	if got := readMemoryFile(t, dir); !bytes.Equal(got, atFreeze) {
		t.Fatalf("memory file vs guest memory at the freeze: %s", firstDiff(got, atFreeze))
	}
	// Paused before: today's frozen path.
	testHookPrecopied = nil
	st, err = m.Snapshot(filepath.Join(base, "paused"), SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Precopy != 0 || st.RecopiedBytes != 0 {
		t.Errorf("snapshot of a paused VM pre-copied: %+v", st)
	}
	m.Stop()

	snap, err := snapshot.Open(inc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(snap, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, len(pattern))
	if _, err := r.Memory().ReadAt(got, page); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, pattern) {
		t.Fatal("the incremental snapshot after a failed pre-copy snapshot lost a page dirtied before it")
	}
}
