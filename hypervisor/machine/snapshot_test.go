package machine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-runtime/cube/hypervisor/kvmtest"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// counterAddr is where the counter guest stores its count.
const counterAddr = 0x3000000

// counterCode counts in RAX forever and stores each value at counterAddr,
// so both registers and memory must come back on a rollback.
var counterCode = []byte{
	0x48, 0x31, 0xc0, // xor rax, rax
	0x48, 0xff, 0xc0, // loop: inc rax
	0x48, 0x89, 0x04, 0x25, 0x00, 0x00, 0x00, 0x03, // mov [0x3000000], rax
	0xeb, 0xf3, // jmp loop
}

func counter(t testing.TB, m *Machine) uint64 {
	t.Helper()
	v, err := m.Memory().ReadUint64(counterAddr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func waitCounter(t testing.TB, m *Machine, above uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for counter(t, m) <= above {
		if time.Now().After(deadline) {
			t.Fatalf("counter stuck at %d (want > %d)", counter(t, m), above)
		}
		time.Sleep(time.Millisecond)
	}
}

func startCounter(t testing.TB) *Machine {
	t.Helper()
	var cons bytes.Buffer
	m := newMachineTB(t, counterCode, 1, &cons)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, 1000)
	return m
}

func TestSnapshotRollbackRestore(t *testing.T) {
	m := startCounter(t)
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	saved := counter(t, m)
	savedRegs, err := m.cpus[0].CPU.GetRegs()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	st, err := m.Snapshot(dir, SnapshotOptions{Components: snapshot.Components{KernelSHA256: "k", VMMVersion: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %+v", st)
	if m.State() != Paused {
		t.Fatalf("snapshot of a paused VM left it %v", m.State())
	}
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile(snap.Path(snapshot.MemoryName))
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(mem[counterAddr:]); got != saved {
		t.Fatalf("memory file has counter %d, VM had %d", got, saved)
	}

	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, saved+10000)
	if err := m.Pause(); err != nil {
		t.Fatal(err)
	}
	before := counter(t, m)
	rb, err := m.Rollback(snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback: %+v", rb)
	if got := counter(t, m); got != saved {
		t.Fatalf("after rollback the counter is %d, snapshot had %d (it was %d before)", got, saved, before)
	}
	regs, err := m.cpus[0].CPU.GetRegs()
	if err != nil {
		t.Fatal(err)
	}
	if regs != savedRegs {
		t.Fatalf("after rollback the registers are\n%+v\nwant\n%+v", regs, savedRegs)
	}
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, saved)

	// A second rollback: the memory is now file-backed with its own VMA.
	m.Pause()
	if _, err := m.Rollback(snap); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, m); got != saved {
		t.Fatalf("second rollback: counter %d, want %d", got, saved)
	}
	m.Resume()
	waitCounter(t, m, saved+1000)
	// A rollback of a running guest that never exits to the VMM: every vCPU
	// ioctl must wait until the vCPUs are parked.
	if _, err := m.Rollback(snap); err != nil {
		t.Fatal(err)
	}
	if m.State() != Running {
		t.Fatalf("rollback of a running VM left it %v", m.State())
	}
	waitCounter(t, m, saved)
	m.Stop()

	// Restore in a fresh machine.
	r, err := Restore(snap, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := counter(t, r); got != saved {
		t.Fatalf("restored memory has counter %d, want %d", got, saved)
	}
	if err := r.StartRestored(false); err != nil {
		t.Fatal(err)
	}
	// The restore's step times (cube-vmm logs them): every step once, in order.
	steps := r.RestoreSteps()
	var names []string
	for _, f := range strings.Fields(steps) {
		n, _, _ := strings.Cut(f, "=")
		names = append(names, n)
	}
	if got, want := strings.Join(names, " "), "layers vm.open vm.create vm.irqchip vm.pit mmap memslots legacy vcpus attach decode state.vm state.vcpus state.devices kvmclock start resume"; got != want {
		t.Errorf("RestoreSteps() = %q, want the steps %q", steps, want)
	}
	waitCounter(t, r, saved)
	// A rollback of the restored machine leaves the restore's figures alone.
	if _, err := r.Rollback(snap); err != nil {
		t.Fatal(err)
	}
	if got := r.RestoreSteps(); got != steps {
		t.Errorf("after a rollback RestoreSteps() = %q, was %q", got, steps)
	}
	r.Stop()
	if mem2, _ := os.ReadFile(snap.Path(snapshot.MemoryName)); !bytes.Equal(mem, mem2) {
		t.Error("the snapshot's memory file changed while mapped")
	}
}

func TestRollbackRefusalLeavesVMRunning(t *testing.T) {
	m := startCounter(t)
	dir := filepath.Join(t.TempDir(), "snap")
	if _, err := m.Snapshot(dir, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	// A snapshot of a differently shaped VM (2 vCPUs).
	var cons bytes.Buffer
	other := newMachine(t, counterCode, 2, &cons)
	other.Start()
	waitCounter(t, other, 10)
	odir := filepath.Join(t.TempDir(), "other")
	if _, err := other.Snapshot(odir, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	other.Stop()
	osnap, err := snapshot.Open(odir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Rollback(osnap)
	if !errors.Is(err, snapshot.ErrMismatch) {
		t.Fatalf("rollback to a 2-vCPU snapshot: %v, want a mismatch", err)
	}
	t.Log(err)
	if m.State() != Running {
		t.Fatalf("VM is %v after a refused rollback", m.State())
	}
	c := counter(t, m)
	waitCounter(t, m, c)

	// A corrupt state file is refused by Open already; a state that decodes
	// but lies about devices is refused by Rollback before the VM is touched.
	snap, err := snapshot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap.State = []byte(`{"Version":1,"VCPUs":[]}`)
	if _, err := m.Rollback(snap); !errors.Is(err, snapshot.ErrMismatch) {
		t.Fatalf("rollback with a bad state: %v", err)
	}
	c = counter(t, m)
	waitCounter(t, m, c)
}

func BenchmarkSnapshot(b *testing.B) {
	m := startCounter(b)
	defer m.Stop()
	base := b.TempDir()
	for i := 0; b.Loop(); i++ {
		if _, err := m.Snapshot(filepath.Join(base, fmt.Sprintf("s%d", i)), SnapshotOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRollback(b *testing.B) {
	m := startCounter(b)
	defer m.Stop()
	dir := filepath.Join(b.TempDir(), "snap")
	if _, err := m.Snapshot(dir, SnapshotOptions{}); err != nil {
		b.Fatal(err)
	}
	snap, err := snapshot.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := m.Rollback(snap); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRestore(b *testing.B) {
	m := startCounter(b)
	dir := filepath.Join(b.TempDir(), "snap")
	if _, err := m.Snapshot(dir, SnapshotOptions{}); err != nil {
		b.Fatal(err)
	}
	m.Stop()
	for b.Loop() {
		snap, err := snapshot.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		r, err := Restore(snap, Config{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.StartRestored(false); err != nil {
			b.Fatal(err)
		}
		r.Close()
	}
}

func newMachineTB(t testing.TB, code []byte, vcpus int, cons *bytes.Buffer) *Machine {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kernel")
	if err := os.WriteFile(p, kvmtest.SyntheticBzImage(code), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Kernel: p, Cmdline: "console=ttyS0", MemoryMiB: 64, VCPUs: vcpus, Console: cons})
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("no KVM device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestIncremental: full snapshot, then diff layers with the guest's writes
// (KVM dirty log) and the VMM's (device-side writes); restore composes
// the chain; a rollback makes its snapshot the next parent.
func TestIncremental(t *testing.T) {
	m := startCounter(t)
	base := t.TempDir()
	full := filepath.Join(base, "full")
	m.Pause()
	if _, err := m.Snapshot(full, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	m.Resume()
	waitCounter(t, m, counter(t, m)+1000)
	m.Pause()
	pattern := bytes.Repeat([]byte{0xa5}, 3*4096)
	if _, err := m.Memory().WriteAt(pattern, 0x2000000); err != nil { // a VMM-side write
		t.Fatal(err)
	}
	c2 := counter(t, m)
	d1 := filepath.Join(base, "d1")
	st, err := m.Snapshot(d1, SnapshotOptions{Incremental: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("incremental: %+v", st)
	if st.MemoryBytes == 0 || st.MemoryBytes > 64*4096 {
		t.Errorf("incremental snapshot wrote %d bytes of memory; want a few pages", st.MemoryBytes)
	}
	m.Resume()
	waitCounter(t, m, c2+1000)
	m.Pause()
	c3 := counter(t, m)
	d2 := filepath.Join(base, "d2")
	if _, err := m.Snapshot(d2, SnapshotOptions{Incremental: true}); err != nil {
		t.Fatal(err)
	}
	snap2, err := snapshot.Open(d2)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(snap2.Manifest.Memory); n != 3 {
		t.Fatalf("d2 has %d layers, want 3", n)
	}
	// Outside the parent's directory: refused.
	if _, err := m.Snapshot(filepath.Join(t.TempDir(), "x"), SnapshotOptions{Incremental: true}); err == nil {
		t.Error("incremental snapshot away from its parent accepted")
	}
	m.Stop()

	r, err := Restore(snap2, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := counter(t, r); got != c3 {
		t.Fatalf("restored chain: counter %d, want %d", got, c3)
	}
	got := make([]byte, len(pattern))
	r.Memory().ReadAt(got, 0x2000000)
	if !bytes.Equal(got, pattern) {
		t.Fatal("restored chain lost the VMM-side write")
	}
	r.StartRestored(false)
	waitCounter(t, r, c3)
	// Rollback to d1, then an incremental snapshot on top of it.
	r.Pause()
	snap1, err := snapshot.Open(d1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Rollback(snap1); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, r); got != c2 {
		t.Fatalf("rollback into a chain: counter %d, want %d", got, c2)
	}
	r.Resume()
	waitCounter(t, r, c2+100)
	r.Pause()
	c4 := counter(t, r)
	d3 := filepath.Join(base, "d3")
	if _, err := r.Snapshot(d3, SnapshotOptions{Incremental: true}); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	snap3, _ := snapshot.Open(d3)
	r2, err := Restore(snap3, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got := counter(t, r2); got != c4 {
		t.Fatalf("chain full→d1→d3: counter %d, want %d", got, c4)
	}
}

// BenchmarkSnapshotDirty measures an incremental snapshot against how
// much memory was dirtied (by the VMM, as device writes would) since the
// previous one, for a 64 MiB and a 1 GiB guest.
func BenchmarkSnapshotDirty(b *testing.B) {
	for _, memMiB := range []int{128, 1024} {
		for _, dirtyMiB := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("guest%dMiB/dirty%dMiB", memMiB, dirtyMiB), func(b *testing.B) {
				m := benchMachine(b, memMiB)
				base := b.TempDir()
				m.Pause()
				if _, err := m.Snapshot(filepath.Join(base, "full"), SnapshotOptions{}); err != nil {
					b.Fatal(err)
				}
				buf := bytes.Repeat([]byte{1}, dirtyMiB<<20)
				i := 0
				for b.Loop() {
					b.StopTimer()
					buf[0] = byte(i)
					m.Memory().WriteAt(buf, 0x1000000)
					i++
					b.StartTimer()
					if _, err := m.Snapshot(filepath.Join(base, fmt.Sprintf("d%d", i)), SnapshotOptions{Incremental: true}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRestoreSize: restore (to a started machine) must not grow with guest memory.
func BenchmarkRestoreSize(b *testing.B) {
	for _, memMiB := range []int{128, 1024} {
		b.Run(fmt.Sprintf("guest%dMiB", memMiB), func(b *testing.B) {
			m := benchMachine(b, memMiB)
			dir := filepath.Join(b.TempDir(), "snap")
			m.Pause()
			if _, err := m.Snapshot(dir, SnapshotOptions{}); err != nil {
				b.Fatal(err)
			}
			m.Stop()
			for b.Loop() {
				snap, err := snapshot.Open(dir)
				if err != nil {
					b.Fatal(err)
				}
				r, err := Restore(snap, Config{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.StartRestored(false); err != nil {
					b.Fatal(err)
				}
				r.Close()
			}
		})
	}
}

func benchMachine(b *testing.B, memMiB int) *Machine {
	p := filepath.Join(b.TempDir(), "kernel")
	os.WriteFile(p, kvmtest.SyntheticBzImage(counterCode), 0o644)
	m, err := New(Config{Kernel: p, MemoryMiB: memMiB, VCPUs: 1})
	if errors.Is(err, os.ErrNotExist) {
		b.Skipf("no KVM device: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	if err := m.Start(); err != nil {
		b.Fatal(err)
	}
	waitCounter(b, m, 1000)
	return m
}

// ramCopy copies all of guest memory (regions back to back).
func ramCopy(m *Machine) []byte {
	var out []byte
	for _, r := range m.Memory().Regions() {
		out = append(out, r.Host...)
	}
	return out
}

// TestRollbackMemoryPaths: a rollback to the VM's parent rewrites only the
// pages written since (by the guest or the VMM), to any other snapshot it
// remaps; either way guest memory then equals the snapshot's byte for byte,
// across diff layers, and a rewrite that fails puts the memory back.
func TestRollbackMemoryPaths(t *testing.T) {
	m := startCounter(t)
	base := t.TempDir()
	vmmWrite := func(b byte) {
		t.Helper()
		if _, err := m.Memory().WriteAt(bytes.Repeat([]byte{b}, 2*4096+100), 0x2000000+int64(b)*4096); err != nil {
			t.Fatal(err)
		}
	}
	run := func() {
		t.Helper()
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
		waitCounter(t, m, counter(t, m)+1000)
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	take := func(name string, incremental bool) (*snapshot.Snapshot, []byte) {
		t.Helper()
		dir := filepath.Join(base, name)
		if _, err := m.Snapshot(dir, SnapshotOptions{Incremental: incremental}); err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s, ramCopy(m)
	}
	rollback := func(s *snapshot.Snapshot, want []byte, mode string) RollbackStats {
		t.Helper()
		st, err := m.Rollback(s)
		if err != nil {
			t.Fatal(err)
		}
		if st.Memory != mode {
			t.Fatalf("rollback to %s: memory %q, want %q", filepath.Base(s.Dir), st.Memory, mode)
		}
		if !bytes.Equal(ramCopy(m), want) {
			t.Fatalf("rollback to %s (%s): guest memory differs from the snapshot's", filepath.Base(s.Dir), mode)
		}
		if m.State() != Paused {
			t.Fatalf("rollback of a paused VM left it %v", m.State())
		}
		return st
	}

	m.Pause()
	a, memA := take("a", false)
	run()
	vmmWrite(1)
	if st := rollback(a, memA, RollbackRewrite); st.Pages < 3 || st.Pages > 64 {
		t.Fatalf("rewrite of the parent rewrote %d pages; want the few the guest and the VMM wrote", st.Pages)
	}
	run()
	b, memB := take("b", false) // now the parent
	run()
	// Another full snapshot: no layer shared with the parent, every page.
	if st := rollback(a, memA, RollbackRewriteAll); st.Pages != m.totalPages() {
		t.Fatalf("rollback to an unrelated full snapshot rewrote %d pages of %d", st.Pages, m.totalPages())
	}
	run()
	vmmWrite(2)
	c, memC := take("c", true) // a diff layer over a
	run()
	vmmWrite(3)
	rollback(c, memC, RollbackRewrite)
	run()
	// c's parent a shares c's base: the pages written since c and those of
	// c's diff layer, not all.
	if st := rollback(a, memA, RollbackRewriteDiff); st.Pages == 0 || st.Pages >= m.totalPages()/2 {
		t.Fatalf("rollback from c to its base a rewrote %d pages of %d; want c's layer and the pages written since", st.Pages, m.totalPages())
	}
	run()
	// And back the other way, a's child c: again only the diff.
	if st := rollback(c, memC, RollbackRewriteDiff); st.Pages == 0 || st.Pages >= m.totalPages()/2 {
		t.Fatalf("rollback from a to its child c rewrote %d pages of %d", st.Pages, m.totalPages())
	}
	run()
	rollback(b, memB, RollbackRewriteAll)
	if st := rollback(b, memB, RollbackRewrite); st.Pages != 0 {
		t.Fatalf("rollback to the parent with nothing written since rewrote %d pages", st.Pages)
	}

	// A parent whose diff layer is cut short after it was opened (the layer is
	// not mapped: cutting a mapped file is the documented misuse): the rewrite
	// fails, the memory is as before the call, and the dirty record is whole
	// (an incremental snapshot over the parent still restores the VM's memory).
	run()
	d, _ := take("d", true)
	run()
	before := ramCopy(m)
	layer, err := os.ReadFile(d.Path(snapshot.MemoryName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(d.Path(snapshot.MemoryName), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rollback(d); !errors.Is(err, snapshot.ErrTruncated) {
		t.Fatalf("rollback to a truncated parent: %v, want ErrTruncated", err)
	}
	if !bytes.Equal(ramCopy(m), before) {
		t.Fatal("a failed rewrite changed guest memory")
	}
	if err := os.WriteFile(d.Path(snapshot.MemoryName), layer, 0o644); err != nil {
		t.Fatal(err)
	}
	e, memE := take("e", true)
	if !bytes.Equal(memE, before) {
		t.Fatal("memory changed between the failed rollback and the snapshot")
	}
	m.Stop()
	r, err := Restore(e, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !bytes.Equal(ramCopy(r), memE) {
		t.Fatal("incremental snapshot after a failed rewrite does not restore the VM's memory")
	}
}
