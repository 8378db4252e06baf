// Package memory is guest physical memory: host mappings (anonymous or
// file-backed) placed at guest-physical addresses, with bounds-checked
// accessors for devices and a VMM-side dirty bitmap that records writes KVM
// cannot see (device emulation writing into the guest).
package memory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the dirty-tracking granule (x86 base page).
const PageSize = 4096

// Range is a guest-physical span of RAM.
type Range struct {
	GPA  uint64
	Size uint64
}

// End is the first address after r.
func (r Range) End() uint64 { return r.GPA + r.Size }

// x86 layout: the 32-bit MMIO hole (PCI BARs, IOAPIC, LAPIC, flash) sits
// between MMIOHoleStart and 4 GiB; RAM beyond it continues at 4 GiB.
const (
	MMIOHoleStart = 3 << 30
	MMIOHoleEnd   = 4 << 30
)

// X86Layout splits size bytes of RAM around the 32-bit MMIO hole.
func X86Layout(size uint64) []Range {
	if size <= MMIOHoleStart {
		return []Range{{0, size}}
	}
	return []Range{{0, MMIOHoleStart}, {MMIOHoleEnd, size - MMIOHoleStart}}
}

// Options say how guest memory is backed.
type Options struct {
	// File, if set, backs the regions back to back from offset 0 (a
	// snapshot's memory file). Private maps it copy-on-write, so the
	// guest's writes never reach the file.
	File    *os.File
	Private bool
	// HugePages asks for transparent huge pages (anonymous memory only).
	HugePages bool
	// HugeTLB backs anonymous memory with 2 MiB pages from the kernel's
	// hugetlb pool (MAP_HUGETLB): KVM then maps the guest with 2 MiB
	// nested pages from the first touch, and neither compaction nor
	// khugepaged moves them. The pages are reserved when mapped (New
	// fails if the pool is short; see hugetlb.go), never swapped, never
	// shared. Every range must be a multiple of 2 MiB. It overrides
	// HugePages and cannot go with File.
	HugeTLB bool
}

// Region is one mapped range.
type Region struct {
	Range
	Host  []byte
	dirty []atomic.Uint64 // one bit per page written by the VMM
}

// Memory is the guest's RAM.
type Memory struct {
	regions []*Region
}

// ErrOutOfBounds is wrapped when an access does not fall inside one region.
var ErrOutOfBounds = errors.New("guest memory access out of bounds")

// New maps the given ranges. Ranges must be page aligned, sorted and
// non-overlapping.
func New(ranges []Range, opt Options) (*Memory, error) {
	if opt.HugeTLB {
		if err := checkHugeTLB(ranges, opt); err != nil {
			return nil, err
		}
	}
	m := &Memory{}
	var fileOff int64
	var prevEnd uint64
	for i, r := range ranges {
		if r.Size == 0 || r.GPA%PageSize != 0 || r.Size%PageSize != 0 {
			m.Close()
			return nil, fmt.Errorf("memory: range %d [%#x,+%#x) is empty or not page aligned", i, r.GPA, r.Size)
		}
		if r.End() < r.GPA || (i > 0 && r.GPA < prevEnd) {
			m.Close()
			return nil, fmt.Errorf("memory: range %d [%#x,+%#x) overlaps or is unsorted", i, r.GPA, r.Size)
		}
		if r.Size > uint64(^uint(0)>>1) {
			m.Close()
			return nil, fmt.Errorf("memory: range %d too large", i)
		}
		prevEnd = r.End()
		var host []byte
		var err error
		if opt.File != nil {
			flags := unix.MAP_SHARED
			if opt.Private {
				flags = unix.MAP_PRIVATE
			}
			host, err = unix.Mmap(int(opt.File.Fd()), fileOff, int(r.Size), unix.PROT_READ|unix.PROT_WRITE, flags|unix.MAP_NORESERVE)
			fileOff += int64(r.Size)
		} else if opt.HugeTLB {
			host, err = mmapHugeTLB(int(r.Size))
			if errors.Is(err, unix.ENOMEM) {
				m.Close()
				return nil, hugeTLBShort(ranges, readHugePool(hugePoolDir), err)
			}
		} else if opt.HugePages {
			host, err = mmapHuge(int(r.Size))
		} else {
			host, err = unix.Mmap(-1, 0, int(r.Size), unix.PROT_READ|unix.PROT_WRITE,
				unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		}
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("memory: map range %d [%#x,+%#x): %w", i, r.GPA, r.Size, err)
		}
		pages := r.Size / PageSize
		m.regions = append(m.regions, &Region{Range: r, Host: host, dirty: make([]atomic.Uint64, (pages+63)/64)})
	}
	return m, nil
}

// Close unmaps all regions. Nothing may touch guest memory afterwards.
func (m *Memory) Close() error {
	var errs []error
	for _, r := range m.regions {
		if r.Host != nil {
			// Raw munmap: unix.Munmap only accepts slices it mapped itself,
			// and huge-page regions are trimmed sub-slices.
			errs = append(errs, unmapRaw(uintptr(unsafe.Pointer(&r.Host[0])), len(r.Host)))
			r.Host = nil
		}
	}
	m.regions = nil
	return errors.Join(errs...)
}

// Regions returns the mapped regions in address order (for KVM slots).
func (m *Memory) Regions() []*Region { return m.regions }

// Size is the total RAM size.
func (m *Memory) Size() uint64 {
	var n uint64
	for _, r := range m.regions {
		n += r.Size
	}
	return n
}

// HostAddr is the host virtual address of a region's mapping.
func (r *Region) HostAddr() uint64 { return uint64(uintptr(unsafe.Pointer(&r.Host[0]))) }

func (m *Memory) find(gpa, n uint64) (*Region, uint64, error) {
	for _, r := range m.regions {
		if gpa >= r.GPA && gpa < r.End() {
			off := gpa - r.GPA
			if n > r.Size-off {
				break
			}
			return r, off, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: [%#x,+%#x)", ErrOutOfBounds, gpa, n)
}

// Slice returns the host bytes backing [gpa, gpa+n), which must lie in one
// region. A caller that writes through the slice must call MarkDirty.
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	r, off, err := m.find(gpa, n)
	if err != nil {
		return nil, err
	}
	return r.Host[off : off+n : off+n], nil
}

// ReadAt copies guest memory at gpa into p (io.ReaderAt).
func (m *Memory) ReadAt(p []byte, gpa int64) (int, error) {
	if gpa < 0 {
		return 0, fmt.Errorf("%w: negative address", ErrOutOfBounds)
	}
	s, err := m.Slice(uint64(gpa), uint64(len(p)))
	if err != nil {
		return 0, err
	}
	return copy(p, s), nil
}

// WriteAt copies p into guest memory at gpa (io.WriterAt) and marks the
// pages dirty.
func (m *Memory) WriteAt(p []byte, gpa int64) (int, error) {
	if gpa < 0 {
		return 0, fmt.Errorf("%w: negative address", ErrOutOfBounds)
	}
	r, off, err := m.find(uint64(gpa), uint64(len(p)))
	if err != nil {
		return 0, err
	}
	n := copy(r.Host[off:], p)
	r.markDirty(off, uint64(n))
	return n, nil
}

// ReadUint16/32/64 and WriteUint16/32/64 are little-endian scalar accesses.
func (m *Memory) ReadUint16(gpa uint64) (uint16, error) {
	s, err := m.Slice(gpa, 2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(s), nil
}

func (m *Memory) ReadUint32(gpa uint64) (uint32, error) {
	s, err := m.Slice(gpa, 4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

func (m *Memory) ReadUint64(gpa uint64) (uint64, error) {
	s, err := m.Slice(gpa, 8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

func (m *Memory) WriteUint16(gpa uint64, v uint16) error {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	_, err := m.WriteAt(b[:], int64(gpa))
	return err
}

func (m *Memory) WriteUint32(gpa uint64, v uint32) error {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	_, err := m.WriteAt(b[:], int64(gpa))
	return err
}

func (m *Memory) WriteUint64(gpa uint64, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	_, err := m.WriteAt(b[:], int64(gpa))
	return err
}

// MarkDirty records a VMM-side write of [gpa, gpa+n). Out-of-range parts
// are ignored: there is nothing to track there.
func (m *Memory) MarkDirty(gpa, n uint64) {
	for _, r := range m.regions {
		lo, hi := max(gpa, r.GPA), min(gpa+n, r.End())
		if lo < hi {
			r.markDirty(lo-r.GPA, hi-lo)
		}
	}
}

func (r *Region) markDirty(off, n uint64) {
	if n == 0 {
		return
	}
	for p := off / PageSize; p <= (off+n-1)/PageSize; p++ {
		r.dirty[p/64].Or(1 << (p % 64))
	}
}

// TakeDirty returns the region's VMM dirty bitmap (bit i: page i) and
// clears it. OR it with KVM's dirty log for a complete picture.
func (r *Region) TakeDirty() []uint64 {
	out := make([]uint64, len(r.dirty))
	for i := range r.dirty {
		out[i] = r.dirty[i].Swap(0)
	}
	return out
}

// hugePageSize is the x86 transparent huge page size.
const hugePageSize = 2 << 20

// mmapHuge maps anonymous memory aligned to 2 MiB and asks for
// transparent huge pages. Alignment matters twice: THP only backs aligned
// 2 MiB ranges, and KVM only maps a 2 MiB guest page when guest-physical
// and host-virtual addresses agree modulo 2 MiB (guest RAM regions start
// 2 MiB aligned). Fewer, larger pages mean far fewer nested page faults
// while the guest first touches its memory.
func mmapHuge(size int) ([]byte, error) {
	raw, err := unix.Mmap(-1, 0, size+hugePageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	base := uintptr(unsafe.Pointer(&raw[0]))
	skip := int((hugePageSize - base%hugePageSize) % hugePageSize)
	// Give back the unaligned head and the unused tail.
	if skip > 0 {
		if err := unmapRaw(base, skip); err != nil {
			unix.Munmap(raw)
			return nil, err
		}
	}
	if tail := hugePageSize - skip; tail > 0 {
		if err := unmapRaw(base+uintptr(skip+size), tail); err != nil {
			unmapRaw(base+uintptr(skip), size)
			return nil, err
		}
	}
	host := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&raw[0]), skip)), size)
	// Advisory: failure (THP disabled) only costs performance.
	_ = unix.Madvise(host, unix.MADV_HUGEPAGE)
	return host, nil
}

func unmapRaw(addr uintptr, n int) error {
	_, _, e := unix.Syscall(unix.SYS_MUNMAP, addr, uintptr(n), 0)
	if e != 0 {
		return e
	}
	return nil
}
