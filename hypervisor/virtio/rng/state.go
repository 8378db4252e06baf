package rng

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the device's serializable state. virtio-rng has none beyond the
// transport's; the struct exists so the snapshot format is uniform and versioned.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	Version uint32 `json:"Version"`
}

// State returns the device state.
func (d *Device) State() State { return State{Version: snapshot.Version} }

// Restore loads a state.
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-rng state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-rng: %w", err)
	}
	return nil
}

// Kind is virtio-rng's kind in a snapshot's device records.
const Kind = "rng"

// StateKind is virtio-rng's kind in a snapshot's device records.
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) { return snapshot.Save(d.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-rng: %w", err)
	}
	return d.Restore(s)
}
