package pci

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// MSIXState is the serializable state of an MSI-X table.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type MSIXState struct {
	Version  uint32      `json:"Version"`
	Enabled  bool        `json:"Enabled"`
	Masked   bool        `json:"Masked"` // function mask
	Table    []MSIXEntry `json:"Table"`
	Pending  []uint64    `json:"Pending"` // PBA bits
	CapStart int         `json:"CapStart"`
}

// State captures the table, PBA and control bits.
func (m *MSIX) State() MSIXState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return MSIXState{
		Version:  snapshot.Version,
		Enabled:  m.enabled,
		Masked:   m.fnMasked,
		Table:    append([]MSIXEntry(nil), m.table...),
		Pending:  append([]uint64(nil), m.pba...),
		CapStart: m.capOff,
	}
}

// Restore loads a state captured by State. The config space (which also holds
// the control bits) must be restored first.
func (m *MSIX) Restore(s MSIXState) error {
	if err := snapshot.CheckVersion("msi-x state", s.Version); err != nil {
		return fmt.Errorf("restore msi-x: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(s.Table) != len(m.table) || len(s.Pending) != len(m.pba) || s.CapStart != m.capOff {
		return fmt.Errorf("restore msi-x: %d vectors at %#x in snapshot, device has %d at %#x",
			len(s.Table), s.CapStart, len(m.table), m.capOff)
	}
	copy(m.table, s.Table)
	for i := range m.table {
		m.table[i].Control &= msixVecMasked
	}
	copy(m.pba, s.Pending)
	m.enabled, m.fnMasked = s.Enabled, s.Masked
	return nil
}
