// Package pci emulates a conventional PCI bus for the VMM: type-0 configuration
// headers with capability lists, the BAR sizing protocol, MSI-X, a host bridge,
// configuration access through ports 0xCF8/0xCFC and ECAM, and BAR placement in
// an MMIO window. Everything a guest writes here is untrusted: accesses of any
// offset and size are accepted and never panic.
package pci

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// Standard type-0 header offsets.
const (
	RegVendorID      = 0x00
	RegDeviceID      = 0x02
	RegCommand       = 0x04
	RegStatus        = 0x06
	RegRevisionID    = 0x08
	RegClassProgIF   = 0x09
	RegHeaderType    = 0x0E
	RegBAR0          = 0x10
	RegSubsysVendor  = 0x2C
	RegSubsysID      = 0x2E
	RegCapPtr        = 0x34
	RegInterruptLine = 0x3C
	RegInterruptPin  = 0x3D

	// ConfigSize is the conventional configuration space size. ECAM exposes
	// 4 KiB per function; the extended part reads as zero (no extended caps).
	ConfigSize = 256

	// Command register bits.
	CmdIOSpace     = 1 << 0
	CmdMemorySpace = 1 << 1
	CmdBusMaster   = 1 << 2
	CmdIntxDisable = 1 << 10

	statusCapList = 1 << 4

	// Capability IDs.
	CapIDMSIX   = 0x11
	CapIDVendor = 0x09

	NumBARs = 6
)

// BARKind says what address space a BAR decodes.
type BARKind uint8

const (
	BARNone BARKind = iota
	BARMem32
	BARMem64 // occupies two BAR slots (i and i+1)
	BARIO
)

// BARInfo describes a BAR the device implements.
type BARInfo struct {
	Kind         BARKind
	Size         uint64 // power of two; >= 16 for memory, >= 4 for I/O
	Prefetchable bool
}

// Header holds the identity fields of a type-0 header.
type Header struct {
	VendorID, DeviceID      uint16
	SubsysVendor, SubsysID  uint16
	Revision                uint8
	Class, Subclass, ProgIF uint8
	InterruptPin            uint8 // 0 = none, 1 = INTA#
	HeaderType              uint8 // 0 for endpoints
}

// Config is one function's configuration space. Reads and writes go through a
// per-byte write mask so read-only fields stay read-only and the BAR sizing
// protocol (write all ones, read back the size mask) falls out of the mask.
// Config is safe for concurrent use.
type Config struct {
	mu      sync.Mutex
	data    [ConfigSize]byte
	wmask   [ConfigSize]byte // bits the guest may write
	w1c     [ConfigSize]byte // bits the guest clears by writing 1
	bars    [NumBARs]BARInfo
	capTail int // offset of the last capability's next pointer, 0 if none
	capEnd  int // first free byte for the next capability
}

// NewConfig builds a type-0 header.
func NewConfig(h Header) *Config {
	c := &Config{capEnd: 0x40}
	le := binary.LittleEndian
	le.PutUint16(c.data[RegVendorID:], h.VendorID)
	le.PutUint16(c.data[RegDeviceID:], h.DeviceID)
	c.data[RegRevisionID] = h.Revision
	c.data[RegClassProgIF] = h.ProgIF
	c.data[RegClassProgIF+1] = h.Subclass
	c.data[RegClassProgIF+2] = h.Class
	c.data[RegHeaderType] = h.HeaderType
	le.PutUint16(c.data[RegSubsysVendor:], h.SubsysVendor)
	le.PutUint16(c.data[RegSubsysID:], h.SubsysID)
	c.data[RegInterruptPin] = h.InterruptPin
	// Command: I/O, memory, bus master, INTx disable are writable.
	le.PutUint16(c.wmask[RegCommand:], CmdIOSpace|CmdMemorySpace|CmdBusMaster|CmdIntxDisable)
	// Status: error bits are write-1-to-clear; none are ever set by us, but
	// the mask keeps the register's semantics honest.
	le.PutUint16(c.w1c[RegStatus:], 0xF900)
	c.wmask[RegInterruptLine] = 0xFF
	// Cache line size and latency timer are plain read/write scratch.
	c.wmask[0x0C] = 0xFF
	c.wmask[0x0D] = 0xFF
	return c
}

// SetBAR declares BAR i. It must be called before the device is put on a bus.
func (c *Config) SetBAR(i int, b BARInfo) error {
	if i < 0 || i >= NumBARs {
		return fmt.Errorf("bar %d out of range", i)
	}
	if b.Size == 0 || b.Size&(b.Size-1) != 0 {
		return fmt.Errorf("bar %d: size %#x is not a power of two", i, b.Size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	le := binary.LittleEndian
	off := RegBAR0 + 4*i
	switch b.Kind {
	case BARMem32:
		if b.Size < 16 || b.Size > 1<<31 {
			return fmt.Errorf("bar %d: bad mem32 size %#x", i, b.Size)
		}
		var lo uint32
		if b.Prefetchable {
			lo |= 1 << 3
		}
		le.PutUint32(c.data[off:], lo)
		le.PutUint32(c.wmask[off:], ^uint32(b.Size-1)&^0xF)
	case BARMem64:
		if i == NumBARs-1 || b.Size < 16 {
			return fmt.Errorf("bar %d: bad mem64 bar", i)
		}
		lo := uint32(0x4)
		if b.Prefetchable {
			lo |= 1 << 3
		}
		le.PutUint32(c.data[off:], lo)
		mask := ^(b.Size - 1)
		le.PutUint32(c.wmask[off:], uint32(mask)&^0xF)
		le.PutUint32(c.wmask[off+4:], uint32(mask>>32))
		c.bars[i+1] = BARInfo{} // upper half
	case BARIO:
		if b.Size < 4 || b.Size > 256 {
			return fmt.Errorf("bar %d: bad io size %#x", i, b.Size)
		}
		le.PutUint32(c.data[off:], 0x1)
		le.PutUint32(c.wmask[off:], ^uint32(b.Size-1)&^0x3)
	default:
		return fmt.Errorf("bar %d: unknown kind %d", i, b.Kind)
	}
	c.bars[i] = b
	return nil
}

// BAR returns the declaration of BAR i.
func (c *Config) BAR(i int) BARInfo {
	if i < 0 || i >= NumBARs {
		return BARInfo{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bars[i]
}

// BARAddress returns the base address currently programmed into BAR i.
func (c *Config) BARAddress(i int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.barAddressLocked(i)
}

func (c *Config) barAddressLocked(i int) uint64 {
	if i < 0 || i >= NumBARs {
		return 0
	}
	le := binary.LittleEndian
	off := RegBAR0 + 4*i
	lo := le.Uint32(c.data[off:])
	switch c.bars[i].Kind {
	case BARMem32:
		return uint64(lo &^ 0xF)
	case BARMem64:
		hi := le.Uint32(c.data[off+4:])
		return uint64(hi)<<32 | uint64(lo&^0xF)
	case BARIO:
		return uint64(lo &^ 0x3)
	}
	return 0
}

// SetBARAddress programs BAR i the way firmware would. addr must be aligned to the BAR size.
func (c *Config) SetBARAddress(i int, addr uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= NumBARs || c.bars[i].Kind == BARNone {
		return fmt.Errorf("bar %d not implemented", i)
	}
	b := c.bars[i]
	if addr&(b.Size-1) != 0 {
		return fmt.Errorf("bar %d: address %#x not aligned to size %#x", i, addr, b.Size)
	}
	le := binary.LittleEndian
	off := RegBAR0 + 4*i
	lo := le.Uint32(c.data[off:])
	switch b.Kind {
	case BARMem32:
		if addr>>32 != 0 {
			return fmt.Errorf("bar %d: address %#x above 4 GiB for a 32-bit bar", i, addr)
		}
		le.PutUint32(c.data[off:], uint32(addr)|lo&0xF)
	case BARMem64:
		le.PutUint32(c.data[off:], uint32(addr)|lo&0xF)
		le.PutUint32(c.data[off+4:], uint32(addr>>32))
	case BARIO:
		le.PutUint32(c.data[off:], uint32(addr)|lo&0x3)
	}
	return nil
}

// Command returns the command register.
func (c *Config) Command() uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return binary.LittleEndian.Uint16(c.data[RegCommand:])
}

// SetCommand sets the command register (firmware role).
func (c *Config) SetCommand(v uint16) {
	c.mu.Lock()
	defer c.mu.Unlock()
	binary.LittleEndian.PutUint16(c.data[RegCommand:], v)
}

// AddCapability appends a capability with the given ID and body (the bytes
// after the ID and next pointer). writable marks guest-writable bits of the
// body (nil: read-only). It returns the capability's offset.
func (c *Config) AddCapability(id byte, body, writable []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 2 + len(body)
	start := (c.capEnd + 3) &^ 3
	if start+n > ConfigSize {
		return 0, fmt.Errorf("capability %#x (%d bytes) does not fit in config space", id, n)
	}
	if writable != nil && len(writable) != len(body) {
		return 0, fmt.Errorf("capability %#x: writable mask length %d != body length %d", id, len(writable), len(body))
	}
	c.data[start] = id
	c.data[start+1] = 0
	copy(c.data[start+2:], body)
	if writable != nil {
		copy(c.wmask[start+2:], writable)
	}
	if c.capTail == 0 {
		c.data[RegCapPtr] = byte(start)
	} else {
		c.data[c.capTail] = byte(start)
	}
	c.capTail = start + 1
	c.capEnd = start + n
	st := binary.LittleEndian.Uint16(c.data[RegStatus:])
	binary.LittleEndian.PutUint16(c.data[RegStatus:], st|statusCapList)
	return start, nil
}

// Read copies config bytes at off into p. Bytes beyond the conventional space
// read as zero (ECAM's extended space has no capabilities here).
func (c *Config) Read(off uint64, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range p {
		o := off + uint64(i)
		if o < off || o >= ConfigSize {
			p[i] = 0
			continue
		}
		p[i] = c.data[o]
	}
}

// Write applies a guest write through the write masks.
func (c *Config) Write(off uint64, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, v := range p {
		o := off + uint64(i)
		if o < off || o >= ConfigSize {
			return
		}
		m := c.wmask[o]
		d := c.data[o]&^m | v&m
		d &^= v & c.w1c[o]
		c.data[o] = d
	}
}

// Bytes returns a copy of the raw config space (for snapshots).
func (c *Config) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := make([]byte, ConfigSize)
	copy(b, c.data[:])
	return b
}

// Restore replaces the writable parts of the config space from a snapshot. Read-only
// identity bytes are kept from the device's own construction, so a snapshot of a
// different device model cannot change what the device claims to be.
func (c *Config) Restore(b []byte) error {
	if len(b) != ConfigSize {
		return fmt.Errorf("restore pci config: %d bytes, want %d", len(b), ConfigSize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.data {
		m := c.wmask[i]
		c.data[i] = c.data[i]&^m | b[i]&m
	}
	return nil
}
