package machine

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/vcpu"
)

// memLayers are a snapshot's memory files, opened and checked.
type memLayers struct {
	files   []*os.File
	bitmaps [][]uint64 // nil for the base layer
}

// openLayers opens the snapshot's memory layers and reads their bitmaps,
// checking each file's size against the manifest again: a mapping reaching
// past the end of its file would fault (SIGBUS) where the guest touches it.
func openLayers(snap *snapshot.Snapshot) (*memLayers, error) {
	l := &memLayers{}
	for i, ml := range snap.Manifest.Memory {
		f, err := openLayer(snap, ml)
		var bm []uint64
		if err == nil {
			if bm, err = snap.Bitmap(i); err != nil {
				f.Close()
			}
		}
		if err != nil {
			l.close()
			return nil, fmt.Errorf("memory layer %d: %w", i, err)
		}
		l.files, l.bitmaps = append(l.files, f), append(l.bitmaps, bm)
	}
	return l, nil
}

// openLayer opens one memory layer file and checks its size.
func openLayer(snap *snapshot.Snapshot, ml snapshot.MemoryLayer) (*os.File, error) {
	f, err := os.Open(snap.Path(ml.File))
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() != ml.Size {
		err = fmt.Errorf("%s is %d bytes, manifest says %d: %w", ml.File, fi.Size(), ml.Size, snapshot.ErrTruncated)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// close closes the files; the mappings made from them stay valid.
func (l *memLayers) close() {
	for _, f := range l.files {
		f.Close()
	}
}

// mapRegion maps over [host, host+size), which is guest RAM at file offset
// fileOff and already maps the base layer there (memory.New), the base
// layer's large holes as anonymous memory, then each diff layer's pages,
// all private (copy-on-write, lazy: nothing is read until touched).
func (l *memLayers) mapRegion(host uintptr, size, fileOff int64) error {
	holes, err := fileHoles(l.files[0], fileOff, fileOff+size, minAnonHole)
	if err != nil {
		return err
	}
	for _, h := range holes {
		if err := mapAnon(host+uintptr(h[0]-fileOff), h[1]-h[0]); err != nil {
			return err
		}
	}
	first, last := fileOff/memory.PageSize, (fileOff+size)/memory.PageSize
	for i := 1; i < len(l.files); i++ {
		for _, r := range snapshot.Runs(l.bitmaps[i], last) {
			s, e := max(r[0], first), min(r[1], last)
			if s >= e {
				continue
			}
			off := s*memory.PageSize - fileOff
			if err := mapFixed(host+uintptr(off), (e-s)*memory.PageSize, l.files[i], s*memory.PageSize); err != nil {
				return err
			}
		}
	}
	return nil
}

// minAnonHole is the smallest hole of the base memory file that mapRegion
// maps as anonymous memory instead: smaller ones stay file-backed. Each
// hole is a lseek pair, a mapping and a VMA split: at 64 KiB a template's
// holes took 9–18 ms of the restore in the test host, at 2 MiB 3.5 ms,
// and the large holes (memory the template never touched) are most of
// the bytes.
const minAnonHole = 2 << 20

// fileHoles lists the holes of f within [from, to) of at least min bytes,
// page aligned, as [start, end) file offsets.
func fileHoles(f *os.File, from, to, min int64) ([][2]int64, error) {
	var out [][2]int64
	fd := int(f.Fd())
	for off := from; off < to; {
		h, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("find holes in %s: %w", f.Name(), err)
		}
		if h >= to {
			break
		}
		d, err := unix.Seek(fd, h, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || d > to {
			d = to // a hole to the end of the file or past the region
		} else if err != nil {
			return nil, fmt.Errorf("find data in %s: %w", f.Name(), err)
		}
		s, e := (h+memory.PageSize-1)/memory.PageSize*memory.PageSize, d/memory.PageSize*memory.PageSize
		if e-s >= min {
			out = append(out, [2]int64{s, e})
		}
		off = d
	}
	return out, nil
}

// mapAnon maps private anonymous memory over [addr, addr+n): a guest page
// in a hole of the snapshot reads as the zero page and, written, becomes
// a fresh anonymous page, where the file mapping would first fill a page
// cache page with zeros and then copy it.
func mapAnon(addr uintptr, n int64) error {
	if e := mmapPrivate(addr, n, unix.MAP_ANONYMOUS, ^uintptr(0), 0); e != 0 {
		return fmt.Errorf("map anonymous memory at %#x+%#x: %w", addr, n, e)
	}
	return nil
}

// mapFixed maps f from off privately over [addr, addr+n).
func mapFixed(addr uintptr, n int64, f *os.File, off int64) error {
	if e := mmapPrivate(addr, n, 0, f.Fd(), off); e != 0 {
		return fmt.Errorf("map %s at offset %#x: %w", f.Name(), off, e)
	}
	return nil
}

// mmapPrivate replaces [addr, addr+n) with a private, read-write,
// unreserved mapping of fd at off (flags adds MAP_ANONYMOUS, fd then -1).
func mmapPrivate(addr uintptr, n int64, flags int, fd uintptr, off int64) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(n), unix.PROT_READ|unix.PROT_WRITE,
		uintptr(unix.MAP_PRIVATE|unix.MAP_FIXED|unix.MAP_NORESERVE|flags), fd, uintptr(off))
	return e
}

// Restore builds a machine from a snapshot: guest memory mapped from the
// snapshot's memory files (MAP_PRIVATE, so restore time does not grow
// with memory size and the files never change), vCPU, VM and device
// state loaded. attach must add the same virtio devices, in the same
// order, as the snapshotted VM had (disks on working copies of the
// snapshot's disk copies). Start the result with StartRestored.
//
// Restore owns cfg.Prepared whatever the outcome. On failure nothing it
// made remains: KVM VM, vCPUs and guest memory are released, the files
// closed (the devices attach opened are the caller's to close).
func Restore(snap *snapshot.Snapshot, cfg Config, attach func(*Machine) error) (*Machine, error) {
	if cfg.Prepared != nil {
		defer cfg.Prepared.Close() // a no-op once the machine took its VM
	}
	m, err := restore(snap, cfg, attach)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", snap.Dir, err)
	}
	return m, nil
}

func restore(snap *snapshot.Snapshot, cfg Config, attach func(*Machine) error) (*Machine, error) {
	t0 := time.Now()
	man := snap.Manifest
	cfg.MemoryMiB, cfg.VCPUs = man.Shape.MemoryMiB, man.Shape.VCPUs
	cfg.Defaults()
	if cfg.MemoryMiB < 64 || cfg.VCPUs < 1 || cfg.VCPUs > 254 {
		return nil, fmt.Errorf("shape %d MiB, %d vCPUs: %w", cfg.MemoryMiB, cfg.VCPUs, snapshot.ErrCorrupt)
	}
	m := &Machine{cfg: cfg, log: cfg.Log, done: make(chan struct{}), steps: NewSteps(t0)}
	// Decoding the state (JSON) is, in a fresh process under TCG, the
	// costliest step of a restore; it needs no machine, so it runs beside
	// the KVM work below on another CPU.
	parsing := make(chan parsedState, 1) // buffered: an early return leaves no goroutine behind
	go func() {
		s, err := snapshot.DecodePayload(snap.State)
		parsing <- parsedState{s, err}
	}()
	layers, err := openLayers(snap)
	if err != nil {
		return nil, err
	}
	defer layers.close()
	m.steps.Mark("layers")
	err = m.build(layers, attach)
	if err == nil {
		err = m.loadState(snap, parsing)
	}
	if err != nil {
		m.release()
		return nil, err
	}
	m.log.WithFields(logrus.Fields{"dir": snap.Dir, "layers": len(layers.files), "took": time.Since(t0), "steps_ms": m.steps.String()}).Info("machine restored")
	return m, nil
}

// parsedState is the decoded state payload, or why it did not decode.
type parsedState struct {
	s   *snapshot.State
	err error
}

// build makes the restored machine's parts, in the order of a boot: KVM VM,
// memory mapped from the layers, legacy devices, vCPUs, then attach's
// virtio devices. On error the caller releases what was made.
func (m *Machine) build(layers *memLayers, attach func(*Machine) error) error {
	if err := m.createVM(); err != nil { // marks vm.open, vm.create, vm.irqchip, vm.pit
		return err
	}
	ram := memory.X86Layout(uint64(m.cfg.MemoryMiB) << 20)
	if err := m.mapLayers(ram, layers); err != nil { // marks mmap, memslots
		return err
	}
	last := ram[len(ram)-1].End()
	m.pci64 = (max(last, memory.MMIOHoleEnd) + (1<<30 - 1)) &^ (1<<30 - 1)
	if err := m.addLegacyDevices(); err != nil {
		return err
	}
	m.steps.Mark("legacy")
	for i := 0; i < m.cfg.VCPUs; i++ {
		c, err := m.vm.CreateVCPU(i)
		if err != nil {
			return err
		}
		m.cpus = append(m.cpus, vcpu.New(c, &m.pio, &m.mmio))
	}
	m.steps.Mark("vcpus")
	if attach != nil {
		if err := attach(m); err != nil {
			return err
		}
	}
	m.steps.Mark("attach")
	return nil
}

// mapLayers maps guest RAM from the layers and gives it to KVM, dirty
// logging on from the start: the snapshot is the parent of the next
// incremental one.
func (m *Machine) mapLayers(ram []memory.Range, layers *memLayers) error {
	var err error
	if m.mem, err = memory.New(ram, memory.Options{File: layers.files[0], Private: true}); err != nil {
		return err
	}
	m.steps.Mark("mmap")
	var fileOff int64
	for i, r := range m.mem.Regions() {
		if err = layers.mapRegion(uintptr(r.HostAddr()), int64(r.Size), fileOff); err != nil {
			return err
		}
		fileOff += int64(r.Size)
		if err = m.vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
			Slot: uint32(i), Flags: kvm.MemLogDirtyPages, GuestPhysAddr: r.GPA, MemorySize: r.Size, UserspaceAddr: r.HostAddr(),
		}); err != nil {
			return err
		}
	}
	m.steps.Mark("memslots")
	return nil
}

// loadState waits for the decoded state, checks it against the built
// machine and loads it; the snapshot becomes the machine's parent.
func (m *Machine) loadState(snap *snapshot.Snapshot, parsing <-chan parsedState) error {
	m.snap.logging, m.snap.fileBacked = true, true
	m.setParentLocked(snap.Dir, snap.State)
	p := <-parsing
	if p.err != nil {
		return p.err
	}
	if err := m.checkState(p.s); err != nil {
		return err
	}
	m.steps.Mark("decode") // the wait for the decode, no longer its whole cost
	if err := m.applyState(p.s, true); err != nil {
		return err
	}
	return m.newGeneration("restore")
}

// RestoreSteps lists how long each step of Restore and StartRestored took
// (milliseconds, in order), for the caller's log; empty before
// StartRestored returns.
func (m *Machine) RestoreSteps() string {
	m.ctl.Lock()
	defer m.ctl.Unlock()
	return m.restoreSteps
}

// StartRestored runs a restored machine: vCPUs (told their clock was
// paused), then the transports Restore left paused. With paused, the vCPU
// threads start parked and the machine is Paused until Resume.
func (m *Machine) StartRestored(paused bool) error {
	// Serialized with Pause/Resume/Snapshot/Rollback: one of those between
	// Start and the parking below would leave vCPUs and state disagreeing.
	m.ctl.Lock()
	defer m.ctl.Unlock()
	for _, c := range m.cpus {
		_ = c.CPU.KVMClockCtrl()
		if paused {
			c.RequestPause() // before Start: the thread parks before its first KVM_RUN
		}
	}
	m.steps.Mark("kvmclock")
	if err := m.Start(); err != nil {
		return err
	}
	m.steps.Mark("start")
	defer func() {
		// Done: later rollbacks (applyState) must not add to it.
		m.steps.Mark("resume")
		m.restoreSteps, m.steps = m.steps.String(), nil
	}()
	if paused {
		m.cpus.Pause()
		m.mu.Lock()
		if m.state == Running {
			m.state = Paused
		}
		m.mu.Unlock()
	}
	for _, v := range m.virtio {
		v.tr.Resume()
	}
	return nil
}
