package pci

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
)

// Function is one PCI function on the bus. ReadConfig/WriteConfig receive
// guest config accesses (offset 0..4095, any length); a device that needs to
// react to config writes (MSI-X enable, ...) intercepts them here and
// otherwise forwards to its Config. ReadBAR/WriteBAR receive accesses inside
// BAR bar at offset off (off+len(data) <= the BAR size is guaranteed).
type Function interface {
	Config() *Config
	ReadConfig(off uint64, data []byte)
	WriteConfig(off uint64, data []byte)
	ReadBAR(bar int, off uint64, data []byte)
	WriteBAR(bar int, off uint64, data []byte)
}

// Ports of configuration mechanism #1.
const (
	PortConfigAddress = 0xCF8
	PortConfigData    = 0xCFC
	MaxSlots          = 32
)

// Window is a guest-physical address range for BARs.
type Window struct {
	Base, Size uint64
}

// Region is one decoded BAR: guest addresses [Base, Base+Size) belong to
// Slot's BAR. IO reports a port range instead of MMIO.
type Region struct {
	Slot int
	BAR  int
	Base uint64
	Size uint64
	IO   bool
	Fn   Function
}

// Bus is PCI bus 0 with a host bridge at slot 0. Safe for concurrent use by vCPU threads.
type Bus struct {
	mu      sync.Mutex
	slots   [MaxSlots]Function
	cf8     uint32
	mmio    Window
	nextMem uint64
	io      Window
	nextIO  uint64
	regions []Region // currently decoded BARs, sorted by (IO, Base)
	onRemap func([]Region)
}

// NewBus creates bus 0 with a host bridge in slot 0. mmio is where memory BARs
// are placed (it must also be described to the guest, e.g. in the ACPI host
// bridge's _CRS); io is the port window for I/O BARs (may be empty).
func NewBus(mmio, io Window) *Bus {
	b := &Bus{mmio: mmio, nextMem: mmio.Base, io: io, nextIO: io.Base}
	b.slots[0] = NewHostBridge()
	return b
}

// OnRemap registers a callback run (without bus locks held) whenever the set of
// decoded BAR regions changes, e.g. when the guest moves a BAR or toggles
// memory decoding. The VMM uses it to re-register ioeventfds.
func (b *Bus) OnRemap(f func([]Region)) {
	b.mu.Lock()
	b.onRemap = f
	b.mu.Unlock()
}

// Add places f in the lowest free slot and assigns its BARs in the windows,
// naturally aligned, as firmware would, with decoding and bus mastering enabled.
func (b *Bus) Add(f Function) (slot int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	slot = -1
	for i := 1; i < MaxSlots; i++ {
		if b.slots[i] == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		return 0, fmt.Errorf("pci: no free slot")
	}
	cfg := f.Config()
	cmd := uint16(0)
	for i := 0; i < NumBARs; i++ {
		bi := cfg.BAR(i)
		switch bi.Kind {
		case BARMem32, BARMem64:
			addr := alignUp(b.nextMem, bi.Size)
			end := addr + bi.Size
			if addr < b.nextMem || end < addr || end > b.mmio.Base+b.mmio.Size ||
				(bi.Kind == BARMem32 && end > 1<<32) {
				return 0, fmt.Errorf("pci slot %d bar %d: %#x bytes do not fit in mmio window %#x+%#x", slot, i, bi.Size, b.mmio.Base, b.mmio.Size)
			}
			if err := cfg.SetBARAddress(i, addr); err != nil {
				return 0, fmt.Errorf("pci slot %d: %w", slot, err)
			}
			b.nextMem = end
			cmd |= CmdMemorySpace
		case BARIO:
			addr := alignUp(b.nextIO, bi.Size)
			end := addr + bi.Size
			if addr < b.nextIO || end > b.io.Base+b.io.Size {
				return 0, fmt.Errorf("pci slot %d bar %d: %#x ports do not fit in io window", slot, i, bi.Size)
			}
			if err := cfg.SetBARAddress(i, addr); err != nil {
				return 0, fmt.Errorf("pci slot %d: %w", slot, err)
			}
			b.nextIO = end
			cmd |= CmdIOSpace
		}
	}
	cfg.SetCommand(cfg.Command() | cmd | CmdBusMaster)
	b.slots[slot] = f
	b.recomputeLocked()
	return slot, nil
}

// Function returns the function in slot, or nil.
func (b *Bus) Function(slot int) Function {
	if slot < 0 || slot >= MaxSlots {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.slots[slot]
}

// Rescan recomputes the decoded regions from config space and runs the remap
// callback if they changed. Call it after restoring functions' config space
// from a snapshot (the guest may have moved BARs away from where Add put them).
func (b *Bus) Rescan() {
	b.mu.Lock()
	changed := b.recomputeLocked()
	cb, rs := b.onRemap, append([]Region(nil), b.regions...)
	b.mu.Unlock()
	if changed && cb != nil {
		cb(rs)
	}
}

// Regions returns the currently decoded BARs.
func (b *Bus) Regions() []Region {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Region(nil), b.regions...)
}

// recomputeLocked rebuilds the decoded-region list from config space. A BAR
// decodes when its space is enabled in the command register and its address
// is not zero and not the sizing pattern (Linux turns decoding off while it
// sizes BARs, but be safe either way: a region that would wrap is skipped).
func (b *Bus) recomputeLocked() (changed bool) {
	var rs []Region
	for s, f := range b.slots {
		if f == nil || s == 0 {
			continue
		}
		cfg := f.Config()
		cmd := cfg.Command()
		for i := 0; i < NumBARs; i++ {
			bi := cfg.BAR(i)
			if bi.Kind == BARNone {
				continue
			}
			io := bi.Kind == BARIO
			if io && cmd&CmdIOSpace == 0 || !io && cmd&CmdMemorySpace == 0 {
				continue
			}
			base := cfg.BARAddress(i)
			if base == 0 || base+bi.Size < base {
				continue
			}
			rs = append(rs, Region{Slot: s, BAR: i, Base: base, Size: bi.Size, IO: io, Fn: f})
		}
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].IO != rs[j].IO {
			return !rs[i].IO
		}
		return rs[i].Base < rs[j].Base
	})
	if regionsEqual(rs, b.regions) {
		return false
	}
	b.regions = rs
	return true
}

func regionsEqual(a, b []Region) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Slot != b[i].Slot || a[i].BAR != b[i].BAR || a[i].Base != b[i].Base || a[i].Size != b[i].Size || a[i].IO != b[i].IO {
			return false
		}
	}
	return true
}

func (b *Bus) find(addr uint64, n int, io bool) (Region, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.regions {
		if r.IO != io {
			continue
		}
		if addr >= r.Base && addr-r.Base < r.Size && uint64(n) <= r.Size-(addr-r.Base) {
			return r, true
		}
	}
	return Region{}, false
}

// MMIORead dispatches a guest MMIO read; it returns false if no BAR decodes addr.
// Unclaimed reads should return all ones (the VMM decides).
func (b *Bus) MMIORead(addr uint64, data []byte) bool {
	r, ok := b.find(addr, len(data), false)
	if !ok {
		return false
	}
	r.Fn.ReadBAR(r.BAR, addr-r.Base, data)
	return true
}

// MMIOWrite dispatches a guest MMIO write; it returns false if no BAR decodes addr.
func (b *Bus) MMIOWrite(addr uint64, data []byte) bool {
	r, ok := b.find(addr, len(data), false)
	if !ok {
		return false
	}
	r.Fn.WriteBAR(r.BAR, addr-r.Base, data)
	return true
}

// PIORead handles port reads: 0xCF8-0xCFF and I/O BARs. It returns false for other ports.
func (b *Bus) PIORead(port uint16, data []byte) bool {
	switch {
	case port >= PortConfigAddress && port < PortConfigAddress+4:
		b.mu.Lock()
		var buf [4]byte
		binary.LittleEndian.PutUint32(buf[:], b.cf8)
		b.mu.Unlock()
		fill(data, 0xFF)
		copy(data, buf[port-PortConfigAddress:])
		return true
	case port >= PortConfigData && port < PortConfigData+4:
		b.mu.Lock()
		a := b.cf8
		b.mu.Unlock()
		fill(data, 0xFF)
		if a&(1<<31) == 0 {
			return true
		}
		off := uint64(a&0xFC) + uint64(port-PortConfigData)
		b.configRead(int(a>>16&0xFF), int(a>>11&0x1F), int(a>>8&7), off, clamp(data, 4-int(port-PortConfigData)))
		return true
	}
	r, ok := b.find(uint64(port), len(data), true)
	if !ok {
		return false
	}
	r.Fn.ReadBAR(r.BAR, uint64(port)-r.Base, data)
	return true
}

// PIOWrite handles port writes: 0xCF8-0xCFF and I/O BARs. It returns false for other ports.
func (b *Bus) PIOWrite(port uint16, data []byte) bool {
	switch {
	case port >= PortConfigAddress && port < PortConfigAddress+4:
		// Only dword writes to 0xCF8 latch the address; byte writes to 0xCF9
		// are the PC reset-control register, which is not ours.
		if port == PortConfigAddress && len(data) == 4 {
			b.mu.Lock()
			b.cf8 = binary.LittleEndian.Uint32(data) & 0x80FFFFFC
			b.mu.Unlock()
			return true
		}
		return port == PortConfigAddress
	case port >= PortConfigData && port < PortConfigData+4:
		b.mu.Lock()
		a := b.cf8
		b.mu.Unlock()
		if a&(1<<31) == 0 {
			return true
		}
		off := uint64(a&0xFC) + uint64(port-PortConfigData)
		b.configWrite(int(a>>16&0xFF), int(a>>11&0x1F), int(a>>8&7), off, clamp(data, 4-int(port-PortConfigData)))
		return true
	}
	r, ok := b.find(uint64(port), len(data), true)
	if !ok {
		return false
	}
	r.Fn.WriteBAR(r.BAR, uint64(port)-r.Base, data)
	return true
}

// ECAMSize is the size of the ECAM window for bus 0 only.
const ECAMSize = 1 << 20

// ECAMRead serves a read at off inside the ECAM (MMCONFIG) window for bus 0.
func (b *Bus) ECAMRead(off uint64, data []byte) {
	fill(data, 0xFF)
	if off >= ECAMSize {
		return
	}
	reg := off & 0xFFF
	b.configRead(0, int(off>>15&0x1F), int(off>>12&7), reg, clamp(data, int(0x1000-reg)))
}

// ECAMWrite serves a write at off inside the ECAM window for bus 0.
func (b *Bus) ECAMWrite(off uint64, data []byte) {
	if off >= ECAMSize {
		return
	}
	reg := off & 0xFFF
	b.configWrite(0, int(off>>15&0x1F), int(off>>12&7), reg, clamp(data, int(0x1000-reg)))
}

func (b *Bus) configRead(bus, slot, fn int, off uint64, data []byte) {
	f := b.lookup(bus, slot, fn)
	if f == nil {
		fill(data, 0xFF)
		return
	}
	f.ReadConfig(off, data)
}

func (b *Bus) configWrite(bus, slot, fn int, off uint64, data []byte) {
	f := b.lookup(bus, slot, fn)
	if f == nil {
		return
	}
	f.WriteConfig(off, data)
	// BAR and command writes change decoding; anything else cannot.
	if off < RegBAR0+4*NumBARs && off+uint64(len(data)) > RegCommand {
		b.Rescan()
	}
}

func (b *Bus) lookup(bus, slot, fn int) Function {
	if bus != 0 || fn != 0 || slot < 0 || slot >= MaxSlots {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.slots[slot]
}

func clamp(p []byte, n int) []byte {
	if n < 0 {
		n = 0
	}
	if len(p) > n {
		return p[:n]
	}
	return p
}

func alignUp(v, a uint64) uint64 {
	return (v + a - 1) &^ (a - 1)
}

// HostBridge is the bus's slot-0 host bridge: identity only, no BARs.
type HostBridge struct{ cfg *Config }

// NewHostBridge returns an Intel-ID host bridge (class 06/00), like Firecracker's and Cloud Hypervisor's.
func NewHostBridge() *HostBridge {
	return &HostBridge{cfg: NewConfig(Header{VendorID: 0x8086, DeviceID: 0x0d57, Class: 0x06, Subclass: 0x00})}
}

func (h *HostBridge) Config() *Config                  { return h.cfg }
func (h *HostBridge) ReadConfig(off uint64, d []byte)  { h.cfg.Read(off, d) }
func (h *HostBridge) WriteConfig(off uint64, d []byte) { h.cfg.Write(off, d) }
func (h *HostBridge) ReadBAR(int, uint64, []byte)      {}
func (h *HostBridge) WriteBAR(int, uint64, []byte)     {}
