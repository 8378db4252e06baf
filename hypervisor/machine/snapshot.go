package machine

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
	"github.com/cube-runtime/cube/hypervisor/virtio/blk"
)

// Snapshot, restore and rollback. The consistency window: the caller has
// the guest agent sync (or freeze) filesystems; then, with m.ctl held,
// vCPUs park → virtio transports pause (no device writes guest memory) →
// vCPU, VM and device state → guest memory → disk copies → transports and
// vCPUs resume. fsync and the rename into place happen after the resume.
//
// A full snapshot of a running VM first pre-copies: with the dirty record
// cleared, all guest memory is written while the VM runs; then, in the
// freeze window, only the pages written meanwhile are written again (see
// precopy).

// virtioDev is an attached virtio device.
type virtioDev struct {
	dev virtio.Device
	tr  *virtio.PCITransport
}

// snapState is the machine's snapshot bookkeeping.
type snapState struct {
	msrs []uint32 // readable MSR indices, found on the first snapshot
	// logging: KVM dirty logging is on. parent: the snapshot directory
	// the memory equalled when the dirty records were last cleared.
	logging bool
	parent  string
	// parentState: sha256 of the parent's state payload, telling that
	// snapshot apart from another later written at the same path.
	parentState [32]byte
	// pending: pages dirtied since parent whose record a pre-copy took
	// out of KVM's log and the VMM's bitmap (nil: none). takeDirtyLocked
	// adds them back, so a pre-copy never loses what an incremental
	// snapshot over parent needs.
	pending []uint64
	// fileBacked: guest memory is (partly) mapped from snapshot files
	// (after a restore or rollback), not only anonymous memory.
	fileBacked bool
}

// Shape is the VM's shape as a snapshot records it.
func (m *Machine) Shape() (snapshot.Shape, error) {
	s := snapshot.Shape{VCPUs: m.cfg.VCPUs, MemoryMiB: m.cfg.MemoryMiB}
	for _, v := range m.virtio {
		d, ok := v.dev.(*blk.Device)
		if !ok {
			continue
		}
		fi, err := os.Stat(d.Path())
		if err != nil {
			return s, fmt.Errorf("disk %s: %w", d.Path(), err)
		}
		s.Disks = append(s.Disks, snapshot.Disk{Serial: d.Serial(), ReadOnly: d.ReadOnly(), Size: fi.Size(), Source: d.Path()})
	}
	return s, nil
}

func (m *Machine) disks() []*blk.Device {
	var out []*blk.Device
	for _, v := range m.virtio {
		if d, ok := v.dev.(*blk.Device); ok {
			out = append(out, d)
		}
	}
	return out
}

// SnapshotOptions are what the machine cannot know itself.
type SnapshotOptions struct {
	Components snapshot.Components
	Config     json.RawMessage // the VMM's configuration, for restore
	// Incremental writes only the pages dirtied since the parent (the last
	// snapshot, rollback or restore); dir must be beside the parent.
	Incremental bool
}

// SnapshotStats says what a snapshot cost.
type SnapshotStats struct {
	Frozen      time.Duration // vCPUs parked
	Total       time.Duration
	Precopy     time.Duration // the pre-copy pass, VM running (0: none)
	MemoryBytes int64         // bytes of memory written (zero pages are holes), pre-copy included
	// RecopiedBytes: of MemoryBytes, those written again in the freeze
	// window after a pre-copy (the pages the VM dirtied meanwhile).
	RecopiedBytes int64
	DiskBytes     int64
	Reflinked     bool // every writable disk was reflinked
}

// Snapshot writes the VM into dir (which must not exist). A running VM
// is paused for the freeze window and resumed; a paused one stays paused.
func (m *Machine) Snapshot(dir string, opt SnapshotOptions) (st SnapshotStats, err error) {
	// snapMu for the whole snapshot: the pre-copy reads guest memory and
	// relies on the dirty record without m.ctl held (see precopy).
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	t0 := time.Now()
	shape, err := m.Shape()
	if err != nil {
		return st, fmt.Errorf("snapshot: %w", err)
	}
	var parentLayers []snapshot.MemoryLayer
	if opt.Incremental {
		m.ctl.Lock()
		parentLayers, err = m.parentLayers(dir)
		m.ctl.Unlock()
		if err != nil {
			return st, err
		}
	}
	need := int64(m.mem.Size())
	for _, d := range shape.Disks {
		if !d.ReadOnly {
			need += allocatedBytes(d.Source, d.Size)
		}
	}
	w, err := snapshot.Create(dir, need)
	if err != nil {
		return st, err
	}
	defer w.Abort()
	memFile, err := w.CreateFile(snapshot.MemoryName)
	if err != nil {
		return st, err
	}
	defer memFile.Close()

	precopied := false
	if !opt.Incremental {
		tp := time.Now()
		var n int64
		if n, precopied, err = m.precopy(memFile); err != nil {
			return st, fmt.Errorf("snapshot: %w", err)
		}
		if precopied {
			st.Precopy, st.MemoryBytes = time.Since(tp), n
		}
	}
	if testHookPrecopied != nil {
		if err := testHookPrecopied(); err != nil {
			return st, fmt.Errorf("snapshot: %w", err)
		}
	}

	m.ctl.Lock()
	wasRunning, err := m.freezeLocked("snapshot")
	if err != nil {
		m.ctl.Unlock()
		return st, err
	}
	tf := time.Now()
	payload, err := m.snapshotFrozenLocked(w, memFile, &shape, precopied, opt.Incremental, &st)
	m.thawLocked(wasRunning)
	st.Frozen = time.Since(tf)
	m.ctl.Unlock()
	if err != nil {
		return st, fmt.Errorf("snapshot: %w", err)
	}
	man := &snapshot.Manifest{
		Shape: shape, Components: opt.Components, Config: opt.Config,
		Memory: []snapshot.MemoryLayer{{File: snapshot.MemoryName, Size: int64(m.mem.Size())}},
	}
	if opt.Incremental {
		man.Memory = append(parentLayers, snapshot.MemoryLayer{File: snapshot.MemoryName, Size: int64(m.mem.Size()), Bitmap: snapshot.BitmapName})
	}
	if err := w.Commit(man, payload); err != nil {
		return st, err
	}
	m.ctl.Lock()
	m.setParentLocked(dir, payload)
	m.ctl.Unlock()
	st.Total = time.Since(t0)
	m.log.WithFields(logrus.Fields{"dir": dir, "frozen": st.Frozen, "total": st.Total, "precopy": st.Precopy,
		"memory_bytes": st.MemoryBytes, "recopied_bytes": st.RecopiedBytes, "reflinked": st.Reflinked}).Info("snapshot written")
	return st, nil
}

// snapshotFrozenLocked is Snapshot's freeze window: it captures the vCPU, VM
// and device state, writes guest memory into memFile (the pages dirtied since
// the pre-copy when precopied, else a diff layer when incremental, else all
// of it) and copies the writable disks into w, recording each copy's file and
// size in shape. It returns the encoded state payload and adds what it wrote
// to st.
//
// Ordering: vCPUs parked and transports paused (freezeLocked), m.ctl held,
// so nothing writes guest memory or the disks while they are read; the
// caller thaws the VM whatever this returns. Within it:
//   - the disks are checked against shape first: shape was read before the
//     freeze, and a disk re-pointed since would be recorded with the wrong
//     backing file;
//   - the parent is forgotten before the dirty record is taken: taking it
//     consumes it, so every failure from there on must leave no parent for
//     an incremental snapshot to build on;
//   - after a pre-copy, pending is dropped and the record collected (the
//     pre-copy read those pages); otherwise the record is taken and dirty
//     logging turned on; either way inside the window, so the next
//     incremental snapshot's record starts exactly at this one;
//   - the disks are copied in the window too: with the transports paused no
//     block request is in progress, so the copies match memory and state.
func (m *Machine) snapshotFrozenLocked(w *snapshot.Writer, memFile *os.File, shape *snapshot.Shape, precopied, incremental bool, st *SnapshotStats) ([]byte, error) {
	// The shape was read before the freeze: a disk re-pointed since
	// would be recorded with the wrong backing file.
	for i, d := range m.disks() {
		if p := d.Path(); p != shape.Disks[i].Source {
			return nil, fmt.Errorf("disk %q was re-pointed at %s while the snapshot started; retry", d.Serial(), p)
		}
	}
	s, err := m.captureState()
	if err != nil {
		return nil, err
	}
	b, err := snapshot.EncodePayload(s)
	if err != nil {
		return nil, err
	}
	var regions [][]byte
	for _, r := range m.mem.Regions() {
		regions = append(regions, r.Host)
	}
	// The next incremental snapshot starts here; if this one fails,
	// the dirty record is lost, so the parent is forgotten.
	m.snap.parent = ""
	if precopied {
		// Exactly the pages written since the pre-copy cleared the
		// record (the pending ones were read by the pre-copy).
		m.snap.pending = nil
		dirty, err := m.collectDirtyLocked()
		if err != nil {
			return nil, err
		}
		n, err := snapshot.RewritePages(memFile, regions, dirty)
		st.MemoryBytes += n
		st.RecopiedBytes = n
		if err != nil {
			return nil, err
		}
	} else {
		dirty, err := m.takeDirtyLocked()
		if err != nil {
			return nil, err
		}
		if err := m.enableDirtyLogLocked(); err != nil {
			return nil, err
		}
		if incremental {
			st.MemoryBytes, err = w.WriteDiffLayer(memFile, regions, dirty)
		} else {
			st.MemoryBytes, err = m.writeFull(memFile, regions, m.snap.fileBacked)
		}
		if err != nil {
			return nil, err
		}
	}
	if testHookFrozen != nil {
		testHookFrozen()
	}
	st.Reflinked = true
	for i, d := range shape.Disks {
		if d.ReadOnly {
			continue
		}
		name := snapshot.DiskName(i)
		n, ref, err := w.CloneDisk(d.Source, name)
		if err != nil {
			return nil, fmt.Errorf("disk %d: %w", i, err)
		}
		shape.Disks[i].File, shape.Disks[i].Size = name, n
		st.DiskBytes += n
		st.Reflinked = st.Reflinked && ref
	}
	return b, nil
}

// writeFull writes a full memory layer. Anonymous guest memory (a VM booted
// here, never restored or rolled back) is written from its populated pages
// only: the others were never written and read as zero, and scanning them to
// find that out would fault every one of them in. File-backed memory is
// scanned whole (its unfaulted pages hold the file's data).
func (m *Machine) writeFull(f *os.File, regions [][]byte, fileBacked bool) (int64, error) {
	if !fileBacked {
		var pop []uint64
		for _, r := range regions {
			// Regions are whole MiB: each one's bits fill whole words.
			p, err := memory.PopulatedPages(r)
			if err != nil {
				m.log.WithError(err).Warn("snapshot: scanning all guest memory")
				return snapshot.WriteFull(f, regions)
			}
			pop = append(pop, p...)
		}
		return snapshot.WriteDiff(f, regions, pop)
	}
	return snapshot.WriteFull(f, regions)
}

// precopy writes all guest memory into f (as writeFull: the same pages)
// while a running VM keeps running, so that the freeze window only has to
// write the pages dirtied meanwhile. It returns ok false, with f empty, when
// the snapshot must take the frozen path instead (the VM is not running, or
// the pre-copy failed); err only when f could not be emptied again.
//
// Why the result is exact. Ordering, all of it load-bearing:
//  1. With m.ctl held: dirty logging on, then the dirty record (KVM's log
//     and the VMM's device-write bitmap) taken and cleared. From here on
//     every page the guest or a device writes is in the record: KVM marks
//     a page before the guest's store lands, the memory package marks it
//     after the device's copy, and either way the mark is taken at the
//     freeze at the latest.
//  2. Without m.ctl: every page is read and written to f. A page read
//     while it changes may be torn; it is then in the record.
//  3. Frozen (vCPUs parked, transports paused, so nothing writes): the
//     record is taken and exactly its pages are written again, zero ones
//     punched (RewritePages), because f may hold their older contents.
//
// A page not in the final record was not written after step 1 began, so
// step 2 read its final contents. Nothing else may take the record between
// 1 and 3: Snapshot and Rollback hold m.snapMu throughout, and so does
// Close before it unmaps guest memory; Pause, Resume, Stop and SetDisk only
// take m.ctl and still work during the pre-copy (a VM paused meanwhile is
// simply not running at the freeze; a stopped one fails the freeze).
//
// Step 1 clears the record an incremental snapshot over the current parent
// needs; it is kept in m.snap.pending, which takeDirtyLocked adds back, so
// the parent stays valid if this snapshot fails after the pre-copy.
func (m *Machine) precopy(f *os.File) (n int64, ok bool, err error) {
	m.ctl.Lock()
	if m.State() != Running {
		m.ctl.Unlock()
		return 0, false, nil
	}
	if err := m.enableDirtyLogLocked(); err != nil {
		m.ctl.Unlock()
		m.log.WithError(err).Warn("snapshot: no pre-copy")
		return 0, false, nil
	}
	dirty, err := m.collectDirtyLocked()
	if err != nil {
		// Part of the record may already be cleared: the parent's
		// incremental chain cannot be trusted any more.
		m.snap.parent, m.snap.pending = "", nil
		m.ctl.Unlock()
		m.log.WithError(err).Warn("snapshot: no pre-copy")
		return 0, false, nil
	}
	if m.snap.parent != "" {
		m.snap.pending = orBitmap(m.snap.pending, dirty)
	} else {
		m.snap.pending = nil
	}
	fileBacked := m.snap.fileBacked
	var regions [][]byte
	for _, r := range m.mem.Regions() {
		regions = append(regions, r.Host)
	}
	m.ctl.Unlock()

	n, err = m.writeFull(f, regions, fileBacked)
	if err == nil {
		return n, true, nil
	}
	m.log.WithError(err).Warn("snapshot: pre-copy failed, writing memory while frozen")
	// The frozen path writes only non-zero pages over the file: whatever
	// the pre-copy left must go first.
	if terr := f.Truncate(0); terr != nil {
		return 0, false, fmt.Errorf("pre-copy failed (%v), and emptying the memory file: %w", err, terr)
	}
	return 0, false, nil
}

// Test hooks, nil outside tests: between the pre-copy and the freeze (an
// error fails the snapshot there), and in the freeze window once memory is
// written.
var (
	testHookPrecopied func() error
	testHookFrozen    func()
)

// orBitmap ORs b into a (which may be nil) and returns it.
func orBitmap(a, b []uint64) []uint64 {
	if a == nil {
		return b
	}
	for i := range min(len(a), len(b)) {
		a[i] |= b[i]
	}
	return a
}

// freezeLocked parks the vCPUs and pauses the transports; m.ctl is held.
func (m *Machine) freezeLocked(op string) (wasRunning bool, err error) {
	switch s := m.State(); s {
	case Running:
		m.cpus.Pause()
		wasRunning = true
	case Paused:
	default:
		return false, fmt.Errorf("%s: machine is %v", op, s)
	}
	// Ordering: vCPUs first (no new kicks), then transports (devices stop
	// writing guest memory).
	for _, v := range m.virtio {
		v.tr.Pause()
	}
	return wasRunning, nil
}

// thawLocked undoes freezeLocked: transports, then vCPUs.
func (m *Machine) thawLocked(wasRunning bool) {
	for _, v := range m.virtio {
		v.tr.Resume()
	}
	if wasRunning {
		for _, c := range m.cpus {
			_ = c.CPU.KVMClockCtrl() // EINVAL before the guest enables kvmclock
		}
		m.cpus.Resume()
	}
}

// allocatedBytes is what a copy of the disk at path can take: a file's
// blocks (a copy keeps its holes: snapshot.CloneDisk), else size.
func allocatedBytes(path string, size int64) int64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return size // a block device is copied whole
	}
	return min(st.Blocks*512, size)
}
