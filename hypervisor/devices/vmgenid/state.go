package vmgenid

import (
	"encoding/hex"
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the device's snapshot state: where the guest's tables say the id
// is, which GSI notifies it, and the id the guest's memory holds there.
// Its json names are the snapshot format's: changing one is a
// snapshot.Version bump.
type State struct {
	Version uint32 `json:"Version"`
	Addr    uint64 `json:"Addr"`
	GSI     uint32 `json:"GSI"`
	ID      string `json:"ID"` // 32 hex digits
}

// Kind is the device's kind in a snapshot.
const Kind = "vmgenid"

// State returns the device state.
func (d *Device) State() State {
	id := d.ID()
	return State{Version: snapshot.Version, Addr: d.opt.Addr, GSI: d.opt.GSI, ID: hex.EncodeToString(id[:])}
}

// Restore loads a state. Address and GSI are the guest's (its ACPI tables,
// in the snapshot's memory, name them): a device placed elsewhere is
// refused. The id is not written: the snapshot's memory holds it.
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("vmgenid state", s.Version); err != nil {
		return fmt.Errorf("restore vmgenid: %w", err)
	}
	if s.Addr != d.opt.Addr || s.GSI != d.opt.GSI {
		return fmt.Errorf("restore vmgenid: state has the id at %#x on GSI %d, this VM at %#x on GSI %d: %w",
			s.Addr, s.GSI, d.opt.Addr, d.opt.GSI, snapshot.ErrMismatch)
	}
	b, err := hex.DecodeString(s.ID)
	if err != nil || len(b) != Size {
		return fmt.Errorf("restore vmgenid: id %q is not %d hex bytes: %w", s.ID, Size, snapshot.ErrCorrupt)
	}
	d.mu.Lock()
	copy(d.id[:], b)
	d.mu.Unlock()
	return nil
}

// StateKind is the device's kind in a snapshot (snapshot.Device).
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) { return snapshot.Save(d.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore vmgenid: %w", err)
	}
	return d.Restore(s)
}
