package blk

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the device's serializable state. Requests complete synchronously
// inside Notify, so there are never requests in flight when the VM is paused;
// the disk's bytes are the file itself (snapshotted by reflink, not here).
// Path is the current backing file (after SetBacking, the new one).
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	Version  uint32 `json:"Version"`
	Path     string `json:"Path"`
	ReadOnly bool   `json:"ReadOnly"`
	Serial   string `json:"Serial"`
	Sectors  uint64 `json:"Sectors"`
}

// State returns the device state.
func (d *Device) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return State{Version: snapshot.Version, Path: d.opts.Path, ReadOnly: d.opts.ReadOnly, Serial: d.opts.Serial, Sectors: d.sectors.Load()}
}

// Restore checks that a saved state matches this disk (same mode and
// capacity: the guest's driver has the capacity cached).
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-blk state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-blk: %w", err)
	}
	if cur := d.sectors.Load(); s.Sectors != cur || s.ReadOnly != d.opts.ReadOnly {
		return fmt.Errorf("restore virtio-blk %s: snapshot has %d sectors read-only=%v, disk has %d read-only=%v",
			d.Path(), s.Sectors, s.ReadOnly, cur, d.opts.ReadOnly)
	}
	return nil
}

// Kind is virtio-blk's kind in a snapshot's device records.
const Kind = "blk"

// StateKind is virtio-blk's kind in a snapshot's device records.
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) { return snapshot.Save(d.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-blk: %w", err)
	}
	return d.Restore(s)
}
