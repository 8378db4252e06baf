// Package virtio implements the virtio 1.x device side for the VMM: the modern
// PCI transport (common/notify/ISR/device config capabilities, MSI-X), split
// virtqueues, and the Device interface that blk, rng and vsock implement.
// Everything read from guest memory or registers is untrusted.
package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
)

// Memory is guest physical memory as the VMM exposes it to devices. The
// implementation bounds-checks gpa and length and returns an error (never
// panics) for ranges outside guest RAM.
type Memory interface {
	ReadAt(p []byte, gpa uint64) (int, error)
	WriteAt(p []byte, gpa uint64) (int, error)
}

// DirtyTracker records guest pages written by device emulation. KVM's dirty
// log does not see these writes; an incremental snapshot ORs this record with it.
type DirtyTracker interface {
	MarkDirty(gpa, length uint64)
}

// PageSize is the dirty-tracking granularity.
const PageSize = 4096

// DirtyBitmap is a lock-free DirtyTracker over a guest-physical range [0, size).
// Writes outside the range are ignored (they cannot have reached RAM).
type DirtyBitmap struct {
	words []atomic.Uint64
	pages uint64
}

// NewDirtyBitmap tracks pages of [0, size).
func NewDirtyBitmap(size uint64) *DirtyBitmap {
	pages := (size + PageSize - 1) / PageSize
	return &DirtyBitmap{words: make([]atomic.Uint64, (pages+63)/64), pages: pages}
}

// MarkDirty implements DirtyTracker.
func (d *DirtyBitmap) MarkDirty(gpa, length uint64) {
	if length == 0 {
		return
	}
	first := gpa / PageSize
	last := (gpa + length - 1) / PageSize
	if gpa+length-1 < gpa { // wrapped
		last = ^uint64(0) / PageSize
	}
	for p := first; p <= last && p < d.pages; p++ {
		d.words[p/64].Or(1 << (p % 64))
	}
}

// Drain returns the bitmap (bit n = page n, 64 pages per word, the layout of
// KVM_GET_DIRTY_LOG) and clears it atomically word by word.
func (d *DirtyBitmap) Drain() []uint64 {
	out := make([]uint64, len(d.words))
	for i := range d.words {
		out[i] = d.words[i].Swap(0)
	}
	return out
}

// IsDirty reports whether page p is marked.
func (d *DirtyBitmap) IsDirty(page uint64) bool {
	if page >= d.pages {
		return false
	}
	return d.words[page/64].Load()&(1<<(page%64)) != 0
}

// ErrGuestMemory wraps failed guest memory accesses.
var ErrGuestMemory = errors.New("guest memory access")

// guestMem is the devices' view of memory: checked accesses plus dirty marking.
type guestMem struct {
	mem   Memory
	dirty DirtyTracker
}

func (g guestMem) read(p []byte, gpa uint64) error {
	if gpa+uint64(len(p)) < gpa {
		return fmt.Errorf("%w: read %d bytes at %#x wraps", ErrGuestMemory, len(p), gpa)
	}
	n, err := g.mem.ReadAt(p, gpa)
	if err != nil || n != len(p) {
		return fmt.Errorf("%w: read %d bytes at %#x: got %d: %v", ErrGuestMemory, len(p), gpa, n, err)
	}
	return nil
}

func (g guestMem) write(p []byte, gpa uint64) error {
	if gpa+uint64(len(p)) < gpa {
		return fmt.Errorf("%w: write %d bytes at %#x wraps", ErrGuestMemory, len(p), gpa)
	}
	n, err := g.mem.WriteAt(p, gpa)
	if n > 0 && g.dirty != nil {
		g.dirty.MarkDirty(gpa, uint64(n))
	}
	if err != nil || n != len(p) {
		return fmt.Errorf("%w: write %d bytes at %#x: wrote %d: %v", ErrGuestMemory, len(p), gpa, n, err)
	}
	return nil
}

func (g guestMem) u16(gpa uint64) (uint16, error) {
	var b [2]byte
	err := g.read(b[:], gpa)
	return binary.LittleEndian.Uint16(b[:]), err
}

func (g guestMem) putU16(gpa uint64, v uint16) error {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	return g.write(b[:], gpa)
}
