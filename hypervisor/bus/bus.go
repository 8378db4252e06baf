// Package bus dispatches guest port I/O and MMIO accesses to the devices
// registered on address ranges. One Bus instance serves PIO, another MMIO.
package bus

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// Device handles accesses to its registered range. offset is relative to
// the range's base, so a device does not care where it (or its BAR) sits.
// len(data) is the access width (1, 2, 4 or 8). Read fills data. Both run
// on vCPU threads, possibly concurrently from several vCPUs: devices lock
// their own state. They must not panic on any offset or width.
type Device interface {
	Read(offset uint64, data []byte)
	Write(offset uint64, data []byte)
}

type entry struct {
	base, size uint64
	name       string
	dev        Device
	hits       *atomic.Uint64 // accesses served, for Accesses
}

// Bus is a set of non-overlapping ranges.
type Bus struct {
	mu      sync.RWMutex
	entries []entry // sorted by base
}

// Register adds dev on [base, base+size).
func (b *Bus) Register(base, size uint64, name string, dev Device) error {
	if size == 0 || base+size < base {
		return fmt.Errorf("bus: %s: bad range [%#x,+%#x)", name, base, size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.entries {
		if base < e.base+e.size && e.base < base+size {
			return fmt.Errorf("bus: %s [%#x,+%#x) overlaps %s [%#x,+%#x)", name, base, size, e.name, e.base, e.size)
		}
	}
	b.entries = append(b.entries, entry{base, size, name, dev, new(atomic.Uint64)})
	sort.Slice(b.entries, func(i, j int) bool { return b.entries[i].base < b.entries[j].base })
	return nil
}

// Unregister removes the range starting at base (e.g. when a PCI BAR moves).
func (b *Bus) Unregister(base uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, e := range b.entries {
		if e.base == base {
			b.entries = append(b.entries[:i], b.entries[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("bus: nothing registered at %#x", base)
}

func (b *Bus) lookup(addr uint64, n int) (Device, uint64, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].base+b.entries[i].size > addr })
	if i == len(b.entries) {
		return nil, 0, false
	}
	e := b.entries[i]
	// The whole access must fit: a read straddling two devices goes nowhere.
	if addr < e.base || uint64(n) > e.base+e.size-addr {
		return nil, 0, false
	}
	e.hits.Add(1)
	return e.dev, addr - e.base, true
}

// Read dispatches a read. Unclaimed reads return all ones, as on real
// hardware with nothing decoding the address; ok reports whether a device
// claimed it.
func (b *Bus) Read(addr uint64, data []byte) (ok bool) {
	dev, off, ok := b.lookup(addr, len(data))
	if !ok {
		for i := range data {
			data[i] = 0xff
		}
		return false
	}
	dev.Read(off, data)
	return true
}

// Write dispatches a write; unclaimed writes are dropped.
func (b *Bus) Write(addr uint64, data []byte) (ok bool) {
	dev, off, ok := b.lookup(addr, len(data))
	if !ok {
		return false
	}
	dev.Write(off, data)
	return true
}

// Ranges lists the registrations (for info/debug output).
func (b *Bus) Ranges() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []string
	for _, e := range b.entries {
		out = append(out, fmt.Sprintf("%#x-%#x %s", e.base, e.base+e.size-1, e.name))
	}
	return out
}

// Access is how many accesses one registered range served (Accesses).
type Access struct {
	Name  string
	Base  uint64
	Count uint64
}

// Accesses returns the accesses each registered range served since it was registered, the busiest first
// (ranges never accessed left out): with a VMM's exits, where a guest's exits go.
func (b *Bus) Accesses() []Access {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []Access
	for _, e := range b.entries {
		if n := e.hits.Load(); n > 0 {
			out = append(out, Access{Name: e.name, Base: e.base, Count: n})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out
}
