package machine

import (
	"fmt"
	"path/filepath"

	"github.com/cube-runtime/cube/hypervisor/kvm"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// Incremental snapshots. After a full snapshot (or a rollback or restore)
// KVM logs the pages the guest writes (KVM_MEM_LOG_DIRTY_PAGES on every
// RAM slot) and the memory package records the pages devices write; an
// incremental snapshot writes the union of both as a diff layer over its
// parent's layers. Its parent is the snapshot the VM's memory was last
// made equal to; when that is unknown (a failed snapshot consumed the
// dirty record), only a full snapshot is allowed.

// enableDirtyLogLocked turns on KVM dirty logging on every RAM slot.
func (m *Machine) enableDirtyLogLocked() error {
	if m.snap.logging {
		return nil
	}
	for i, r := range m.mem.Regions() {
		if err := m.vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
			Slot: uint32(i), Flags: kvm.MemLogDirtyPages, GuestPhysAddr: r.GPA, MemorySize: r.Size, UserspaceAddr: r.HostAddr(),
		}); err != nil {
			return fmt.Errorf("enable dirty logging: %w", err)
		}
	}
	m.snap.logging = true
	return nil
}

// takeDirtyLocked returns the pages written since the last call (KVM's
// log OR the VMM's record, OR what a pre-copy set aside in pending), one
// bit per page over the regions back to back, and clears all three.
// Without logging it only clears.
func (m *Machine) takeDirtyLocked() ([]uint64, error) {
	out, err := m.collectDirtyLocked()
	if err != nil {
		return nil, err
	}
	out = orBitmap(out, m.snap.pending)
	m.snap.pending = nil
	return out, nil
}

// collectDirtyLocked is takeDirtyLocked without pending: the pages
// written since the record was last cleared, by anyone.
func (m *Machine) collectDirtyLocked() ([]uint64, error) {
	var out []uint64
	for i, r := range m.mem.Regions() {
		vmm := r.TakeDirty()
		if m.snap.logging {
			kb := make([]uint64, len(vmm))
			if err := m.vm.GetDirtyLog(uint32(i), kb); err != nil {
				return nil, err
			}
			for j := range vmm {
				vmm[j] |= kb[j]
			}
		}
		// Regions are whole MiB, so each ends on a 64-page word boundary.
		out = append(out, vmm...)
	}
	return out, nil
}

// parentLayers returns the memory layers of the VM's current parent
// snapshot as seen from a sibling directory dir.
func (m *Machine) parentLayers(dir string) ([]snapshot.MemoryLayer, error) {
	if m.snap.parent == "" || !m.snap.logging {
		return nil, fmt.Errorf("incremental snapshot: no parent (take a full snapshot first)")
	}
	if filepath.Dir(filepath.Clean(dir)) != filepath.Dir(m.snap.parent) {
		return nil, fmt.Errorf("incremental snapshot: %s must be beside its parent %s", dir, m.snap.parent)
	}
	p, err := snapshot.Open(m.snap.parent)
	if err != nil {
		return nil, fmt.Errorf("incremental snapshot: parent: %w", err)
	}
	out, err := p.ChildLayers()
	if err != nil {
		return nil, fmt.Errorf("incremental snapshot: %w", err)
	}
	return out, nil
}
