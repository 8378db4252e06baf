package machine

import (
	"crypto/sha256"
	"fmt"
	"os"

	"github.com/cube-runtime/cube/hypervisor/memory"
	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// A rollback rewrites guest memory through the existing mappings: the KVM
// memory slots, their host addresses and the VMAs behind them stay as they
// are; only the pages that can differ from the snapshot's are read back from
// its memory layers. An earlier design mapped the snapshot's files over guest
// RAM (mremap aside, mmap MAP_FIXED) for rollbacks to a non-parent snapshot;
// in the test host (nested AMD-V under QEMU's TCG) that left a guest that hung
// or triple-faulted about once in 15 to 60 such rollbacks, with the memslots
// re-registered or not, while rewriting never did (docs/snapshot.md, "Which
// pages a rollback rewrites"). Restore into a new process still maps the files.

// rollbackMemoryLocked brings the snapshot's memory back (st.Memory says
// which pages were candidates, st.Pages how many were rewritten); restore
// puts the old memory back and the dirty record as it was.
// Ordering: vCPUs parked and transports paused (nothing writes guest memory),
// and after this, before the vCPUs run, the state is loaded.
func (m *Machine) rollbackMemoryLocked(p *rollbackPlan, st *RollbackStats) (restore func(), err error) {
	// Which pages can differ was found by prepareRollback, before the
	// freeze (and before the dirty record is taken here).
	l, mode := p.layers, p.mode
	dirty, err := m.takeDirtyLocked()
	if err != nil {
		// Whatever part of the record was taken is gone: no parent now.
		m.snap.parent = ""
		return nil, fmt.Errorf("read dirty log: %w", err)
	}
	pages := dirty
	switch mode {
	case RollbackRewriteDiff:
		pages = orBitmap(orBitmap(make([]uint64, m.totalPages()/64), dirty), p.diff)
	case RollbackRewriteAll:
		pages = make([]uint64, m.totalPages()/64)
		for i := range pages {
			pages[i] = ^uint64(0)
		}
	}
	st.Memory = mode
	undo, err := m.rewritePagesLocked(l, pages, &st.Pages)
	if err != nil {
		m.markDirtyPages(dirty)
		return nil, err
	}
	return func() {
		undo()
		m.markDirtyPages(dirty)
	}, nil
}

// layerDiff says which pages of the VM's parent can differ from the
// snapshot whose layers are l, judged from their memory layers alone: the
// layers they share (the same files, from the first on) hold the same pages,
// so only the pages of the layers either has beyond those can differ. Without
// a parent, or with no layer shared, every page can.
func (m *Machine) layerDiff(l *memLayers) (mode string, diff []uint64) {
	if m.snap.parent == "" || !m.snap.logging {
		return RollbackRewriteAll, nil
	}
	p, err := snapshot.Open(m.snap.parent)
	if err != nil || sha256.Sum256(p.State) != m.snap.parentState {
		// Gone, or another snapshot written at its path since.
		return RollbackRewriteAll, nil
	}
	shared := 0
	for ; shared < len(p.Manifest.Memory) && shared < len(l.files); shared++ {
		fi, err := os.Stat(p.Path(p.Manifest.Memory[shared].File))
		if err != nil {
			break
		}
		li, err := l.files[shared].Stat()
		if err != nil || !os.SameFile(fi, li) || fi.Size() != li.Size() {
			break
		}
	}
	if shared == 0 {
		return RollbackRewriteAll, nil
	}
	// orBitmap stops at the shorter bitmap: diff bounds every layer's to the
	// VM's pages.
	diff = make([]uint64, m.totalPages()/64)
	for i := shared; i < len(l.bitmaps); i++ {
		diff = orBitmap(diff, l.bitmaps[i])
	}
	for i := shared; i < len(p.Manifest.Memory); i++ {
		bm, err := p.Bitmap(i)
		if err != nil || bm == nil {
			// Unreadable, or a full layer past the shared ones: all.
			return RollbackRewriteAll, nil
		}
		diff = orBitmap(diff, bm)
	}
	return RollbackRewriteDiff, diff
}

// totalPages is the number of guest RAM pages, the regions back to back.
func (m *Machine) totalPages() int64 {
	var n int64
	for _, r := range m.mem.Regions() {
		n += int64(r.Size) / memory.PageSize
	}
	return n
}

// rewritePagesLocked reads every page set in pages (a bitmap over the regions
// back to back) from the layer that holds it into guest memory, through the
// existing mappings; undo puts the old contents back. n is set to the number
// of pages rewritten. The old contents are kept until the caller is done:
// a rollback that rewrites every page holds a copy of guest memory meanwhile.
func (m *Machine) rewritePagesLocked(l *memLayers, pages []uint64, n *int64) (undo func(), err error) {
	type saved struct {
		r    *memory.Region
		off  int64
		data []byte
	}
	var old []saved
	undo = func() {
		for _, s := range old {
			copy(s.r.Host[s.off:], s.data)
		}
	}
	*n = 0
	err = m.forDirtyRuns(pages, func(r *memory.Region, fileOff, s, e int64) error {
		// Split the run where the page's owning layer changes.
		first := fileOff / memory.PageSize
		for p := s; p < e; {
			layer := l.owner(first + p)
			q := p + 1
			for q < e && l.owner(first+q) == layer {
				q++
			}
			off, size := p*memory.PageSize, (q-p)*memory.PageSize
			dst := r.Host[off : off+size]
			old = append(old, saved{r: r, off: off, data: append([]byte(nil), dst...)})
			if k, err := l.files[layer].ReadAt(dst, fileOff+off); err != nil || int64(k) != size {
				return fmt.Errorf("memory layer %d: read %d bytes at %#x: got %d: %v: %w",
					layer, size, fileOff+off, k, err, snapshot.ErrTruncated)
			}
			*n += q - p
			p = q
		}
		return nil
	})
	if err != nil {
		undo()
		return nil, err
	}
	return undo, nil
}
