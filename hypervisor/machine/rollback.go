package machine

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
)

// RollbackStats says what a rollback cost.
type RollbackStats struct {
	Prepare time.Duration // validation, disk copies (VM still running)
	Frozen  time.Duration // vCPUs parked
	Total   time.Duration
	// Memory says how guest memory was brought back (which pages were read
	// back from the snapshot); Pages, how many were rewritten.
	Memory string
	Pages  int64
}

// How a rollback brings guest memory back. Every way rewrites pages through
// the existing mappings (the VM keeps its memory slots and host addresses);
// they differ in which pages can differ from the snapshot's.
const (
	// RollbackRewrite: the snapshot is the VM's parent (its last snapshot,
	// restore or rollback): only the pages written since are read back.
	RollbackRewrite = "rewrite-dirty"
	// RollbackRewriteDiff: the snapshot shares memory layers with the VM's
	// parent (one is an incremental snapshot over the other, or both over a
	// common base): the pages written since the parent, plus those of the
	// layers the two do not share.
	RollbackRewriteDiff = "rewrite-diff"
	// RollbackRewriteAll: no known relation to the VM's memory (another
	// full snapshot, or no parent): every page is read back.
	RollbackRewriteAll = "rewrite-all"
)

// Rollback replaces the running VM's whole state (memory, vCPUs, devices,
// writable disks) with the snapshot's, in place: same process, KVM VM,
// sockets. Everything that can fail is done before the VM is touched
// (prepareRollback); during the freeze window the old memory is moved aside
// rather than dropped and the old state kept, so a failure puts the VM
// back as it was. Components are the caller's to check.
func (m *Machine) Rollback(snap *snapshot.Snapshot) (st RollbackStats, err error) {
	// Not during a snapshot's pre-copy: it reads the memory this rewrites,
	// and relies on the dirty record this clears.
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	t0 := time.Now()
	defer func() {
		if err != nil {
			err = fmt.Errorf("rollback to %s: %w", snap.Dir, err)
		}
	}()
	p, err := m.prepareRollback(snap)
	if err != nil {
		return st, err
	}
	defer p.close()
	st.Prepare = time.Since(t0)

	m.ctl.Lock()
	defer m.ctl.Unlock()
	wasRunning, err := m.freezeLocked("rollback")
	if err != nil {
		return st, err
	}
	tf := time.Now()
	defer func() {
		m.thawLocked(wasRunning)
		st.Frozen = time.Since(tf)
		st.Total = time.Since(t0)
	}()
	if err := m.rollbackLocked(snap, p, &st); err != nil {
		return st, err
	}
	m.log.WithFields(logrus.Fields{"dir": snap.Dir, "frozen": time.Since(tf), "memory": st.Memory, "pages": st.Pages}).Info("rolled back")
	return st, nil
}

// rollbackPlan is what a rollback prepares while the VM still runs.
type rollbackPlan struct {
	state  *snapshot.State // decoded and checked against the VM
	layers *memLayers      // the snapshot's memory files, open
	swaps  []diskSwap      // writable disks, in order
	// mode says which pages can differ from the snapshot's (RollbackRewrite*);
	// diff, for RollbackRewriteDiff, those of the layers it does not share
	// with the parent. The parent cannot change before the freeze: Rollback
	// holds m.snapMu throughout, as every change of the parent does.
	mode string
	diff []uint64
}

// diskSwap is a writable disk and the snapshot's copy of it under a
// temporary name beside it; tmp is "" once renamed over path.
type diskSwap struct {
	dev  *blk.Device
	path string
	tmp  string
}

// close removes the disk copies not renamed into place and closes the
// memory files (mappings made from them stay valid).
func (p *rollbackPlan) close() {
	for _, d := range p.swaps {
		if d.tmp != "" {
			os.Remove(d.tmp)
		}
	}
	p.layers.close()
}

// prepareRollback checks snap against the VM (shape, state, disks) and makes
// what the freeze window needs: the state decoded, the memory files open,
// the disk copies made under temporary names beside the live disks. The VM
// is not touched; on failure nothing it made remains.
func (m *Machine) prepareRollback(snap *snapshot.Snapshot) (_ *rollbackPlan, err error) {
	shape, err := m.Shape()
	if err != nil {
		return nil, err
	}
	man := snap.Manifest
	if err := man.CheckShape(shape); err != nil {
		return nil, err
	}
	s, err := m.decodeState(snap.State)
	if err != nil {
		return nil, err
	}
	// A disk re-pointed (SetDisk) at a file other than the snapshot's: the
	// rollback would write the snapshot's disk over that file, which belongs
	// to someone else (another container's rootfs). A disk whose path only
	// differs because this VM was restored elsewhere is fine.
	for i, d := range m.disks() {
		if p, md := d.Path(), man.Shape.Disks[i]; p != d.OpenedPath() && p != md.Source {
			return nil, fmt.Errorf("disk %d (serial %q) was re-pointed at %s, the snapshot had %s; point it back first: %w",
				i, d.Serial(), p, md.Source, snapshot.ErrMismatch)
		}
	}
	layers, err := openLayers(snap)
	if err != nil {
		return nil, err
	}
	p := &rollbackPlan{state: s, layers: layers, mode: RollbackRewrite}
	if !m.isParent(snap) {
		// Snapshot files read here, not in the freeze window.
		p.mode, p.diff = m.layerDiff(layers)
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	for i, d := range m.disks() {
		md := man.Shape.Disks[i]
		if md.ReadOnly {
			continue
		}
		tmp, _, err := snapshot.PrepareClone(d.Path(), snap.Path(md.File))
		if err != nil {
			return nil, fmt.Errorf("disk %d: %w", i, err)
		}
		p.swaps = append(p.swaps, diskSwap{dev: d, path: d.Path(), tmp: tmp})
	}
	return p, nil
}

// rollbackLocked loads the plan into the frozen VM: memory, then state, then
// disks. A failure puts the VM's memory and state back as they were.
// Ordering: vCPUs parked and transports paused (freezeLocked), m.ctl held.
func (m *Machine) rollbackLocked(snap *snapshot.Snapshot, p *rollbackPlan, st *RollbackStats) error {
	if err := m.checkFrozenLocked(p); err != nil {
		return err
	}
	undo, err := m.captureState()
	if err != nil {
		return fmt.Errorf("save current state: %w", err)
	}
	restoreMem, err := m.rollbackMemoryLocked(p, st)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		restoreMem()
		if uerr := m.applyState(undo, false); uerr != nil {
			m.log.WithError(uerr).Error("rollback failed and the previous state could not be fully reloaded")
			return fmt.Errorf("%w (and reloading the previous state: %v)", err, uerr)
		}
		return err
	}
	if err := m.applyState(p.state, false); err != nil {
		return fail(err)
	}
	// Disks last: rename is atomic, and until here nothing touched them.
	for i := range p.swaps {
		d := &p.swaps[i]
		if err := os.Rename(d.tmp, d.path); err != nil {
			return fail(fmt.Errorf("disk %s: %w", d.path, err))
		}
		d.tmp = ""
		if err := d.dev.ReplaceBacking(); err != nil {
			// The path holds the snapshot's copy; the device still has the
			// old inode open, so the guest keeps a consistent disk.
			return fail(err)
		}
	}
	// The memory now equals the snapshot's: it is the next parent.
	m.snap.parent = ""
	if _, err := m.takeDirtyLocked(); err == nil {
		m.setParentLocked(snap.Dir, snap.State)
	}
	// The VM goes back in time: its RNG state would be replayed. Linux
	// wants a new generation on any restore of a snapshot, in place too.
	// The rollback is done by now, so a failure here is logged, not
	// returned (it cannot happen short of a broken KVM VM).
	if err := m.newGeneration("rollback"); err != nil {
		m.log.WithError(err).Error("the rolled-back guest keeps the snapshot's generation id: its RNG is not reseeded by the VMM")
	}
	return nil
}

// checkFrozenLocked makes the checks that need the vCPUs parked; nothing
// has been changed yet.
func (m *Machine) checkFrozenLocked(p *rollbackPlan) error {
	// vCPU ioctls wait for KVM_RUN to return, so CPUID is compared only
	// now that the vCPUs are parked.
	for i, c := range m.cpus {
		cur, err := c.CPU.GetCPUID2()
		if err != nil {
			return err
		}
		if !sameCPUID(cur, cpuidToKVM(p.state.VCPUs[i].CPUID)) {
			return fmt.Errorf("vcpu %d: snapshot CPUID differs from this VM's: %w", i, snapshot.ErrMismatch)
		}
	}
	for _, d := range p.swaps {
		if path := d.dev.Path(); path != d.path {
			return fmt.Errorf("disk %q was re-pointed at %s during the rollback: %w", d.dev.Serial(), path, snapshot.ErrMismatch)
		}
	}
	return nil
}

func sameCPUID(a, b []kvm.CPUIDEntry2) bool {
	// A snapshot written before GetCPUID2 trimmed the zeroed tail has it.
	a, b = kvm.TrimCPUID2(a), kvm.TrimCPUID2(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// isParent reports whether snap is the snapshot the VM's memory last equalled
// with the dirty record complete since: same path and same state payload (a
// snapshot deleted and another written at its path is not the parent).
func (m *Machine) isParent(snap *snapshot.Snapshot) bool {
	abs, err := filepath.Abs(snap.Dir)
	return err == nil && m.snap.logging && m.snap.parent != "" && abs == m.snap.parent &&
		sha256.Sum256(snap.State) == m.snap.parentState
}

// setParentLocked makes the snapshot in dir, whose state payload is state,
// the VM's parent (isParent); a dir that cannot be made absolute leaves none.
func (m *Machine) setParentLocked(dir string, state []byte) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		m.snap.parent = ""
		return
	}
	m.snap.parent, m.snap.parentState = abs, sha256.Sum256(state)
}

// owner is the layer holding page p: the last diff layer whose bitmap has it,
// else the base.
func (l *memLayers) owner(p int64) int {
	for i := len(l.files) - 1; i >= 1; i-- {
		if bm := l.bitmaps[i]; p/64 < int64(len(bm)) && bm[p/64]&(1<<(p%64)) != 0 {
			return i
		}
	}
	return 0
}

// markDirtyPages adds a bitmap over the regions back to back (as
// takeDirtyLocked returns it) to the VMM's dirty record.
func (m *Machine) markDirtyPages(dirty []uint64) {
	m.forDirtyRuns(dirty, func(r *memory.Region, _, s, e int64) error {
		m.mem.MarkDirty(r.GPA+uint64(s)*memory.PageSize, uint64(e-s)*memory.PageSize)
		return nil
	})
}

// forDirtyRuns calls f for each run [s, e) of pages set in dirty, a bitmap
// over the regions back to back (as takeDirtyLocked returns it), with the
// region holding the run, that region's offset in the memory file (its pages
// before it) and s, e counted from the region's first page; it stops at f's
// first error.
func (m *Machine) forDirtyRuns(dirty []uint64, f func(r *memory.Region, fileOff, s, e int64) error) error {
	var fileOff int64
	for _, r := range m.mem.Regions() {
		// Regions are whole MiB: each one's bits fill whole words.
		first, pages := fileOff/memory.PageSize, int64(r.Size)/memory.PageSize
		for _, run := range snapshot.Runs(dirty[first/64:(first+pages)/64], pages) {
			if err := f(r, fileOff, run[0], run[1]); err != nil {
				return err
			}
		}
		fileOff += int64(r.Size)
	}
	return nil
}
