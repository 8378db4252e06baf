package net

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
	"github.com/cube-runtime/cube/hypervisor/virtio"
)

// State is the device's serializable state. Queue indexes and ring
// addresses are the transport's. No buffers are in flight at a snapshot:
// transmit completes each chain inside Notify, and receive pops rx chains
// only once a whole frame fits and publishes them at once (a frame that
// must wait for buffers leaves the avail index where it was). The one frame
// the receive goroutine may hold is host memory and is not saved: a
// restored guest has lost it, as a NIC loses a frame.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	Version uint32 `json:"Version"`
	// MAC is the address the guest's driver read (and caches).
	MAC string `json:"MAC"`
	// LinkUp is VIRTIO_NET_S_LINK_UP in config space.
	LinkUp bool `json:"LinkUp"`
	// Features are the features the driver negotiated (0: no driver): the
	// backend must take the same offloads on restore.
	Features uint64 `json:"Features"`
}

// State returns the device state.
func (d *Device) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return State{Version: snapshot.Version, MAC: d.mac.String(), LinkUp: d.linkUp, Features: d.negotiated}
}

// Restore checks a saved state against this device and loads it. The MAC
// must be the device's own: the guest's driver has it cached (a restore
// under another address is a later change: the guest would have to be told).
// The negotiated features must be ones this device (its backend) offers.
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-net state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-net: %w", err)
	}
	mac, err := ParseMAC(s.MAC)
	if err != nil {
		return fmt.Errorf("restore virtio-net: %v: %w", err, snapshot.ErrCorrupt)
	}
	if mac != d.mac {
		return fmt.Errorf("restore virtio-net: snapshot has mac %s, device has %s: %w", mac, d.mac, snapshot.ErrMismatch)
	}
	offered := d.features | virtio.FVersion1 | virtio.FRingIndirectDesc | virtio.FRingEventIdx
	if s.Features&^offered != 0 {
		return fmt.Errorf("restore virtio-net: the guest negotiated features %#x, this backend offers %#x (a tap without the same offloads?): %w",
			s.Features, offered, snapshot.ErrMismatch)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.linkUp = s.LinkUp
	d.negotiated = s.Features
	return nil
}

// Kind is virtio-net's kind in a snapshot's device records.
const Kind = "net"

// StateKind is virtio-net's kind in a snapshot's device records.
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) { return snapshot.Save(d.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-net: %w", err)
	}
	return d.Restore(s)
}
