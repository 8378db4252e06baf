// Package virtiotest is a test-only virtio driver: fake guest memory and a
// driver that enumerates a device on a real pci.Bus through port 0xCF8/0xCFC,
// negotiates features, programs split queues and MSI-X through the BAR, and
// submits descriptor chains, so device tests exercise the same register paths
// a Linux guest uses.
package virtiotest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/cube-runtime/cube/hypervisor/pci"
	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// Memory is bounds-checked fake guest RAM at guest-physical 0.
type Memory struct {
	mu  sync.Mutex
	Buf []byte
}

// NewMemory returns size bytes of zeroed guest memory.
func NewMemory(size int) *Memory { return &Memory{Buf: make([]byte, size)} }

func (m *Memory) check(n int, gpa uint64) error {
	if gpa > uint64(len(m.Buf)) || uint64(n) > uint64(len(m.Buf))-gpa {
		return fmt.Errorf("gpa %#x+%#x outside %#x bytes of memory", gpa, n, len(m.Buf))
	}
	return nil
}

// ReadAt implements virtio.Memory.
func (m *Memory) ReadAt(p []byte, gpa uint64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(len(p), gpa); err != nil {
		return 0, err
	}
	return copy(p, m.Buf[gpa:]), nil
}

// WriteAt implements virtio.Memory.
func (m *Memory) WriteAt(p []byte, gpa uint64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(len(p), gpa); err != nil {
		return 0, err
	}
	return copy(m.Buf[gpa:], p), nil
}

// Bytes copies n bytes at gpa.
func (m *Memory) Bytes(gpa uint64, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.Buf[gpa:gpa+uint64(n)]...)
}

// Put writes p at gpa.
func (m *Memory) Put(gpa uint64, p []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.Buf[gpa:], p)
}

// MSIRecorder counts MSI messages by data value.
type MSIRecorder struct {
	mu    sync.Mutex
	count map[uint32]int
	c     chan uint32
}

// SignalMSI implements pci.MSISignaler.
func (r *MSIRecorder) SignalMSI(addr uint64, data uint32) error {
	r.mu.Lock()
	if r.count == nil {
		r.count = map[uint32]int{}
	}
	r.count[data]++
	r.mu.Unlock()
	select {
	case r.c <- data:
	default:
	}
	return nil
}

// Count returns how many messages carried data.
func (r *MSIRecorder) Count(data uint32) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count[data]
}

// Desc is a buffer the test driver puts in a chain.
type Desc struct {
	Addr  uint64
	Len   uint32
	Write bool
}

type queue struct {
	size               uint16
	desc, avail, used  uint64
	nextDesc           uint16
	availIdx, usedSeen uint16
}

// Driver is a minimal virtio-pci driver for tests.
type Driver struct {
	T    testing.TB
	Bus  *pci.Bus
	Mem  *Memory
	MSI  *MSIRecorder
	Tr   *virtio.PCITransport
	Slot int
	BAR  uint64
	Caps map[byte]uint32 // cfg_type -> offset in BAR
	qs   []queue
	heap uint64
}

// VectorData is the MSI data value the driver programs for vector v.
func VectorData(v int) uint32 { return 0x100 + uint32(v) }

// ConfigVector is the vector used for config changes (after the queues).
func (d *Driver) ConfigVector() int { return len(d.qs) }

// MemSize is the fake memory size NewDriver allocates.
const MemSize = 16 << 20

// NewDriver puts dev on a new bus with a virtio-pci transport over fake memory.
func NewDriver(t testing.TB, dev virtio.Device, dirty virtio.DirtyTracker) *Driver {
	t.Helper()
	return NewDriverOpts(t, dev, virtio.PCIOptions{Dirty: dirty, Class: 0xFF})
}

// NewDriverOpts is NewDriver with transport options; Mem and MSI are filled in.
func NewDriverOpts(t testing.TB, dev virtio.Device, opts virtio.PCIOptions) *Driver {
	t.Helper()
	return NewDriverSize(t, dev, opts, MemSize)
}

// NewDriverSize is NewDriverOpts with memSize bytes of guest memory (at least
// 2 MiB; fuzz loops use little memory to run fast).
func NewDriverSize(t testing.TB, dev virtio.Device, opts virtio.PCIOptions, memSize int) *Driver {
	t.Helper()
	mem := NewMemory(max(memSize, 2<<20))
	rec := &MSIRecorder{c: make(chan uint32, 1024)}
	opts.Mem, opts.MSI = mem, rec
	tr, err := virtio.NewPCI(dev, opts)
	if err != nil {
		t.Fatalf("new transport: %v", err)
	}
	bus := pci.NewBus(pci.Window{Base: 0xC000_0000, Size: 0x1000_0000}, pci.Window{})
	slot, err := bus.Add(tr)
	if err != nil {
		t.Fatalf("add to bus: %v", err)
	}
	return &Driver{T: t, Bus: bus, Mem: mem, MSI: rec, Tr: tr, Slot: slot, heap: 0x100000}
}

// Interrupts returns the channel of MSI data values as they are delivered.
func (d *Driver) Interrupts() <-chan uint32 { return d.MSI.c }

// CfgRead32 reads config space through 0xCF8/0xCFC.
func (d *Driver) CfgRead32(reg uint32) uint32 {
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], 1<<31|uint32(d.Slot)<<11|reg&0xFC)
	d.Bus.PIOWrite(pci.PortConfigAddress, v[:])
	d.Bus.PIORead(pci.PortConfigData, v[:])
	return binary.LittleEndian.Uint32(v[:])
}

// CfgWrite32 writes config space through 0xCF8/0xCFC.
func (d *Driver) CfgWrite32(reg, val uint32) {
	var v [4]byte
	binary.LittleEndian.PutUint32(v[:], 1<<31|uint32(d.Slot)<<11|reg&0xFC)
	d.Bus.PIOWrite(pci.PortConfigAddress, v[:])
	binary.LittleEndian.PutUint32(v[:], val)
	d.Bus.PIOWrite(pci.PortConfigData, v[:])
}

// Read8/16/32 and Write8/16/32/64 access BAR 0.
func (d *Driver) Read(off uint64, n int) uint64 {
	p := make([]byte, 8)
	if !d.Bus.MMIORead(d.BAR+off, p[:n]) {
		d.T.Fatalf("mmio read at %#x not claimed", d.BAR+off)
	}
	return binary.LittleEndian.Uint64(p)
}

func (d *Driver) Write(off uint64, n int, v uint64) {
	p := make([]byte, 8)
	binary.LittleEndian.PutUint64(p, v)
	if !d.Bus.MMIOWrite(d.BAR+off, p[:n]) {
		d.T.Fatalf("mmio write at %#x not claimed", d.BAR+off)
	}
}

// Probe enumerates the function: BAR address and virtio capabilities.
func (d *Driver) Probe() {
	d.T.Helper()
	if id := d.CfgRead32(0); id&0xFFFF != 0x1AF4 {
		d.T.Fatalf("vendor %#x", id)
	}
	lo, hi := d.CfgRead32(pci.RegBAR0), d.CfgRead32(pci.RegBAR0+4)
	d.BAR = uint64(hi)<<32 | uint64(lo&^0xF)
	d.Caps = map[byte]uint32{}
	seen := 0
	for ptr := d.CfgRead32(pci.RegCapPtr) & 0xFF; ptr != 0; ptr = (d.CfgRead32(ptr) >> 8) & 0xFF {
		if seen++; seen > 48 {
			d.T.Fatal("capability list loops")
		}
		h := d.CfgRead32(ptr)
		if h&0xFF == pci.CapIDVendor {
			typ := byte(h >> 24)
			d.Caps[typ] = d.CfgRead32(ptr + 8)
		}
		if h&0xFF == pci.CapIDMSIX {
			d.CfgWrite32(ptr, h|1<<31) // enable MSI-X
		}
	}
	for _, typ := range []byte{1, 2, 3, 4} {
		if _, ok := d.Caps[typ]; !ok {
			d.T.Fatalf("virtio capability type %d missing", typ)
		}
	}
}

// Alloc returns n bytes of free guest memory (8-byte aligned).
func (d *Driver) Alloc(n int) uint64 {
	a := d.heap
	d.heap = (d.heap + uint64(n) + 15) &^ 15
	if d.heap > uint64(len(d.Mem.Buf)) {
		d.T.Fatal("test heap exhausted")
	}
	return a
}

// Init does the full driver bring-up: reset, ACKNOWLEDGE, DRIVER, features,
// FEATURES_OK, queues (size qsize, MSI-X vector = index), config vector,
// DRIVER_OK. It returns the status read back.
func (d *Driver) Init(features uint64, qsize uint16) uint8 {
	d.T.Helper()
	if d.BAR == 0 {
		d.Probe()
	}
	for v := 0; v < int(d.Tr.NumQueues())+1; v++ {
		e := virtio.MSIXTableOffset + uint64(v)*16
		d.Write(e, 4, 0xFEE0_0000)
		d.Write(e+4, 4, 0)
		d.Write(e+8, 4, uint64(VectorData(v)))
		d.Write(e+12, 4, 0)
	}
	d.Write(virtio.CommonOffset+0x14, 1, 0)
	d.Write(virtio.CommonOffset+0x14, 1, 1)
	d.Write(virtio.CommonOffset+0x14, 1, 3)
	d.Write(virtio.CommonOffset+0x08, 4, 0)
	d.Write(virtio.CommonOffset+0x0C, 4, features&0xFFFFFFFF)
	d.Write(virtio.CommonOffset+0x08, 4, 1)
	d.Write(virtio.CommonOffset+0x0C, 4, features>>32)
	d.Write(virtio.CommonOffset+0x14, 1, 3|8)
	if st := d.Read(virtio.CommonOffset+0x14, 1); st&8 == 0 {
		return uint8(st)
	}
	n := int(d.Read(virtio.CommonOffset+0x12, 2))
	d.qs = make([]queue, n)
	for i := 0; i < n; i++ {
		d.Write(virtio.CommonOffset+0x16, 2, uint64(i))
		max := uint16(d.Read(virtio.CommonOffset+0x18, 2))
		s := min(qsize, max)
		d.Write(virtio.CommonOffset+0x18, 2, uint64(s))
		base := uint64(0x10000 + i*0x10000)
		q := queue{size: s, desc: base, avail: base + 0x8000, used: base + 0xC000}
		d.Write(virtio.CommonOffset+0x1A, 2, uint64(i))
		if got := d.Read(virtio.CommonOffset+0x1A, 2); got != uint64(i) {
			d.T.Fatalf("queue %d vector readback %d", i, got)
		}
		d.Write(virtio.CommonOffset+0x20, 4, q.desc)
		d.Write(virtio.CommonOffset+0x24, 4, 0)
		d.Write(virtio.CommonOffset+0x28, 8, q.avail)
		d.Write(virtio.CommonOffset+0x30, 4, q.used)
		d.Write(virtio.CommonOffset+0x34, 4, 0)
		d.Write(virtio.CommonOffset+0x1C, 2, 1)
		d.qs[i] = q
	}
	d.Write(virtio.CommonOffset+0x10, 2, uint64(n))
	d.Write(virtio.CommonOffset+0x14, 1, 3|8|4)
	return uint8(d.Read(virtio.CommonOffset+0x14, 1))
}

// QueueLayout returns queue q's ring addresses.
func (d *Driver) QueueLayout(q int) (size uint16, desc, avail, used uint64) {
	x := d.qs[q]
	return x.size, x.desc, x.avail, x.used
}

// PutDesc writes descriptor i of table at gpa.
func (d *Driver) PutDesc(table uint64, i uint16, addr uint64, length uint32, flags, next uint16) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
	d.Mem.Put(table+16*uint64(i), b[:])
}

// AddChain writes a direct chain and publishes it; it returns the head.
func (d *Driver) AddChain(qi int, bufs []Desc) uint16 {
	q := &d.qs[qi]
	head := q.nextDesc
	for i, b := range bufs {
		idx := (head + uint16(i)) % q.size
		var flags uint16
		if b.Write {
			flags |= 2
		}
		next := uint16(0)
		if i+1 < len(bufs) {
			flags |= 1
			next = (idx + 1) % q.size
		}
		d.PutDesc(q.desc, idx, b.Addr, b.Len, flags, next)
	}
	q.nextDesc = (head + uint16(len(bufs))) % q.size
	d.Publish(qi, head)
	return head
}

// AddIndirect writes bufs into an indirect table referenced by one descriptor.
func (d *Driver) AddIndirect(qi int, bufs []Desc) uint16 {
	return d.AddIndirectAt(qi, d.Alloc(16*len(bufs)), bufs)
}

// AddIndirectAt is AddIndirect with the table at a caller-chosen address
// (fuzz loops reuse one table instead of allocating).
func (d *Driver) AddIndirectAt(qi int, table uint64, bufs []Desc) uint16 {
	q := &d.qs[qi]
	for i, b := range bufs {
		var flags uint16
		if b.Write {
			flags |= 2
		}
		if i+1 < len(bufs) {
			flags |= 1
		}
		d.PutDesc(table, uint16(i), b.Addr, b.Len, flags, uint16(i+1))
	}
	head := q.nextDesc
	d.PutDesc(q.desc, head, table, uint32(16*len(bufs)), 4, 0)
	q.nextDesc = (head + 1) % q.size
	d.Publish(qi, head)
	return head
}

// Publish puts head in the avail ring and bumps avail idx.
func (d *Driver) Publish(qi int, head uint16) {
	q := &d.qs[qi]
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], head)
	d.Mem.Put(q.avail+4+2*uint64(q.availIdx%q.size), b[:])
	q.availIdx++
	binary.LittleEndian.PutUint16(b[:], q.availIdx)
	d.Mem.Put(q.avail+2, b[:])
}

// SetAvailIdx forces the avail idx (for corrupt-ring tests).
func (d *Driver) SetAvailIdx(qi int, v uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	d.Mem.Put(d.qs[qi].avail+2, b[:])
}

// Kick writes the queue's notify register.
func (d *Driver) Kick(qi int) {
	d.Write(uint64(d.Caps[2])+uint64(qi)*virtio.NotifyMultiplier, 2, uint64(qi))
}

// Used is one used-ring element.
type Used struct {
	ID, Len uint32
}

// PopUsed returns the used elements published since the last call.
func (d *Driver) PopUsed(qi int) []Used {
	q := &d.qs[qi]
	idx := binary.LittleEndian.Uint16(d.Mem.Bytes(q.used+2, 2))
	var out []Used
	for ; q.usedSeen != idx; q.usedSeen++ {
		e := d.Mem.Bytes(q.used+4+8*uint64(q.usedSeen%q.size), 8)
		out = append(out, Used{binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])})
	}
	return out
}

// Status reads the device status.
func (d *Driver) Status() uint8 { return uint8(d.Read(virtio.CommonOffset+0x14, 1)) }

// DeviceConfig reads n bytes of device config at off.
func (d *Driver) DeviceConfig(off uint64, n int) []byte {
	p := make([]byte, n)
	d.Bus.MMIORead(d.BAR+uint64(d.Caps[4])+off, p)
	return p
}

// Swap puts tr (e.g. a transport restored from a snapshot of d.Tr) on a new
// bus in place of the current one; the driver's queues and buffers stay.
func (d *Driver) Swap(tr *virtio.PCITransport) {
	d.T.Helper()
	bus := pci.NewBus(pci.Window{Base: 0xC000_0000, Size: 0x1000_0000}, pci.Window{})
	slot, err := bus.Add(tr)
	if err != nil {
		d.T.Fatalf("add to bus: %v", err)
	}
	if slot != d.Slot || tr.Config().BARAddress(0) != d.BAR {
		d.T.Fatalf("swapped transport at slot %d bar %#x, want %d %#x", slot, tr.Config().BARAddress(0), d.Slot, d.BAR)
	}
	d.Bus, d.Tr = bus, tr
}
