package vsock

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the device's serializable state. Connections are not saved: a
// restored guest gets a transport reset and re-dials (listeners survive).
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	Version      uint32 `json:"Version"`
	GuestCID     uint64 `json:"GuestCID"`
	PendingEvent bool   `json:"PendingEvent"`
	// NextPort is the next host-side port for a host-initiated connection.
	// A restored device continues from it: the guest may still hold sockets
	// (reset but not yet closed by their owners) keyed by the earlier ports,
	// and a new connection must not be mistaken for one of them. Zero (a
	// state from before this field) keeps the default.
	NextPort uint32 `json:"NextPort,omitempty"`
}

// State returns the device state.
func (d *Device) State() State {
	d.mu.Lock()
	defer d.mu.Unlock()
	return State{Version: snapshot.Version, GuestCID: d.cid, PendingEvent: d.event, NextPort: d.nextPort}
}

// Restore loads a saved state. The caller then calls TransportReset once the
// transport is restored, so the guest drops its stale connections.
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-vsock state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-vsock: %w", err)
	}
	if s.GuestCID != d.cid {
		return fmt.Errorf("restore virtio-vsock: snapshot guest cid %d, device has %d", s.GuestCID, d.cid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.event = d.event || s.PendingEvent
	// Never go back: on a rollback the device's own counter may be ahead.
	if s.NextPort >= firstHostPort && s.NextPort > d.nextPort {
		d.nextPort = s.NextPort
	}
	return nil
}

// Kind is virtio-vsock's kind in a snapshot's device records.
const Kind = "vsock"

// StateKind is virtio-vsock's kind in a snapshot's device records.
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) { return snapshot.Save(d.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-vsock: %w", err)
	}
	return d.Restore(s)
}
