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
