package pci

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// MSISignaler delivers one MSI message to the guest. The VMM satisfies it with
// KVM_SIGNAL_MSI (or a routed irqfd).
type MSISignaler interface {
	SignalMSI(addr uint64, data uint32) error
}

// MSI-X constants.
const (
	MSIXEntrySize  = 16
	msixCtrlEnable = 1 << 15
	msixCtrlMask   = 1 << 14
	msixVecMasked  = 1 << 0
	// NoVector is virtio's "no MSI-X vector" value; Notify ignores it.
	NoVector = 0xFFFF
	// MaxMSIXVectors is the architectural maximum table size.
	MaxMSIXVectors = 2048
)

// MSIXEntry is one table entry.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type MSIXEntry struct {
	AddrLo  uint32 `json:"AddrLo"`
	AddrHi  uint32 `json:"AddrHi"`
	Data    uint32 `json:"Data"`
	Control uint32 `json:"Control"`
}

// MSIX is an MSI-X table, its pending-bit array and its capability. The table
// and PBA live in a BAR of the owning device at TableOffset / PBAOffset; the
// owner forwards BAR accesses in those ranges to TableRead/TableWrite/PBARead,
// and calls ConfigWritten after guest writes to config space.
type MSIX struct {
	mu       sync.Mutex
	cfg      *Config
	capOff   int
	table    []MSIXEntry
	pba      []uint64
	enabled  bool
	fnMasked bool
	sig      MSISignaler
	lastErr  error
	observer func(vector int, e MSIXEntry)
}

// OnEntryChange registers f, called (without MSI-X locks held) after the guest
// writes a table entry. A VMM that routes vectors through irqfd updates its
// GSI route there; with KVM_SIGNAL_MSI nothing is needed.
func (m *MSIX) OnEntryChange(f func(vector int, e MSIXEntry)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.observer = f
}

// NewMSIX adds an MSI-X capability with n vectors to cfg. The table is at
// tableOff in BAR bar, the PBA at pbaOff in the same BAR (both 8-byte aligned).
func NewMSIX(cfg *Config, n int, bar int, tableOff, pbaOff uint32, sig MSISignaler) (*MSIX, error) {
	if n < 1 || n > MaxMSIXVectors {
		return nil, fmt.Errorf("msi-x: %d vectors out of range", n)
	}
	if tableOff&7 != 0 || pbaOff&7 != 0 || bar < 0 || bar >= NumBARs {
		return nil, fmt.Errorf("msi-x: bad table/pba placement bar %d table %#x pba %#x", bar, tableOff, pbaOff)
	}
	body := make([]byte, 10)
	binary.LittleEndian.PutUint16(body[0:], uint16(n-1))
	binary.LittleEndian.PutUint32(body[2:], tableOff|uint32(bar))
	binary.LittleEndian.PutUint32(body[6:], pbaOff|uint32(bar))
	wr := make([]byte, 10)
	wr[1] = 0xC0 // enable and function mask
	off, err := cfg.AddCapability(CapIDMSIX, body, wr)
	if err != nil {
		return nil, fmt.Errorf("msi-x: %w", err)
	}
	m := &MSIX{cfg: cfg, capOff: off, table: make([]MSIXEntry, n), pba: make([]uint64, (n+63)/64), sig: sig}
	for i := range m.table {
		m.table[i].Control = msixVecMasked
	}
	return m, nil
}

// Vectors returns the table size.
func (m *MSIX) Vectors() int { return len(m.table) }

// TableSize is the table's size in bytes.
func (m *MSIX) TableSize() uint64 { return uint64(len(m.table)) * MSIXEntrySize }

// PBASize is the PBA's size in bytes.
func (m *MSIX) PBASize() uint64 { return uint64(len(m.pba)) * 8 }

// Enabled reports whether the guest enabled MSI-X.
func (m *MSIX) Enabled() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.enabled
}

// ConfigWritten re-reads the message control register after a config write and
// delivers any pending vectors that became unmasked.
func (m *MSIX) ConfigWritten() {
	var b [2]byte
	m.cfg.Read(uint64(m.capOff+2), b[:])
	ctl := binary.LittleEndian.Uint16(b[:])
	m.mu.Lock()
	defer m.mu.Unlock()
	m.enabled = ctl&msixCtrlEnable != 0
	m.fnMasked = ctl&msixCtrlMask != 0
	m.flushPendingLocked()
}

// TableRead serves a guest read of the table at off (relative to the table start).
func (m *MSIX) TableRead(off uint64, p []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fill(p, 0xFF)
	if !aligned(off, len(p)) || off >= m.TableSize() {
		return
	}
	var buf [16]byte
	e := m.table[off/MSIXEntrySize]
	binary.LittleEndian.PutUint32(buf[0:], e.AddrLo)
	binary.LittleEndian.PutUint32(buf[4:], e.AddrHi)
	binary.LittleEndian.PutUint32(buf[8:], e.Data)
	binary.LittleEndian.PutUint32(buf[12:], e.Control)
	copy(p, buf[off%MSIXEntrySize:])
}

// TableWrite serves a guest write of the table. Only aligned dword and qword
// accesses are defined by the spec; others are ignored.
func (m *MSIX) TableWrite(off uint64, p []byte) {
	m.mu.Lock()
	if !aligned(off, len(p)) || off >= m.TableSize() {
		m.mu.Unlock()
		return
	}
	i := off / MSIXEntrySize
	e := &m.table[i]
	var buf [16]byte
	binary.LittleEndian.PutUint32(buf[0:], e.AddrLo)
	binary.LittleEndian.PutUint32(buf[4:], e.AddrHi)
	binary.LittleEndian.PutUint32(buf[8:], e.Data)
	binary.LittleEndian.PutUint32(buf[12:], e.Control)
	copy(buf[off%MSIXEntrySize:], p)
	e.AddrLo = binary.LittleEndian.Uint32(buf[0:])
	e.AddrHi = binary.LittleEndian.Uint32(buf[4:])
	e.Data = binary.LittleEndian.Uint32(buf[8:])
	e.Control = binary.LittleEndian.Uint32(buf[12:]) & msixVecMasked
	m.flushPendingLocked()
	obs, entry := m.observer, *e
	m.mu.Unlock()
	if obs != nil {
		obs(int(i), entry)
	}
}

// PBARead serves a guest read of the pending bit array; the PBA is read-only.
func (m *MSIX) PBARead(off uint64, p []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fill(p, 0)
	if !aligned(off, len(p)) || off >= m.PBASize() {
		return
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], m.pba[off/8])
	copy(p, buf[off%8:])
}

// Notify raises vector v. It returns false when MSI-X is disabled (the caller may
// fall back to INTx). A masked vector becomes pending and is delivered on unmask.
func (m *MSIX) Notify(v uint16) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.enabled {
		return false, nil
	}
	if int(v) >= len(m.table) {
		return true, nil // NoVector or out of range: nothing to deliver
	}
	if m.fnMasked || m.table[v].Control&msixVecMasked != 0 {
		m.pba[v/64] |= 1 << (v % 64)
		return true, nil
	}
	return true, m.sendLocked(int(v))
}

func (m *MSIX) sendLocked(v int) error {
	if m.sig == nil {
		return nil
	}
	e := m.table[v]
	if err := m.sig.SignalMSI(uint64(e.AddrHi)<<32|uint64(e.AddrLo), e.Data); err != nil {
		m.lastErr = err
		return fmt.Errorf("msi-x vector %d: %w", v, err)
	}
	return nil
}

func (m *MSIX) flushPendingLocked() {
	if !m.enabled || m.fnMasked {
		return
	}
	for v := range m.table {
		if m.pba[v/64]&(1<<(v%64)) == 0 || m.table[v].Control&msixVecMasked != 0 {
			continue
		}
		m.pba[v/64] &^= 1 << (v % 64)
		_ = m.sendLocked(v) // recorded in lastErr; there is no caller to return it to
	}
}

// Entry returns table entry v (for irqfd routing by the VMM).
func (m *MSIX) Entry(v int) (MSIXEntry, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v < 0 || v >= len(m.table) {
		return MSIXEntry{}, false
	}
	return m.table[v], true
}

func aligned(off uint64, n int) bool {
	return (n == 4 || n == 8) && off%uint64(n) == 0
}

func fill(p []byte, v byte) {
	for i := range p {
		p[i] = v
	}
}
