package fs

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the device's serializable state: the share's identity and, when
// the guest has the share mounted, its FUSE session (node ids as paths
// relative to the share, open handles), so a snapshot of a VM using the
// share restores with the guest's node ids and file handles valid.
//
// The shared directory itself is not in it: it is the host's directory, not
// a disk image, and a restore or rollback serves it as it is then. A node
// whose path is gone by then is stale (ESTALE), a handle that no longer
// opens is dropped (EBADF).
//
// Its json names are the snapshot format's: changing one is a
// snapshot.Version bump. Session was added within version 1, omitted when
// nil: a share not mounted, which is what every earlier snapshot recorded
// (they refused a mounted share).
type State struct {
	Version  uint32        `json:"Version"`
	Tag      string        `json:"Tag"`
	Dir      string        `json:"Dir"`
	ReadOnly bool          `json:"ReadOnly"`
	Session  *SessionState `json:"Session,omitempty"`
}

// State returns the device state, the guest's session included.
func (d *Device) State() (State, error) {
	return State{Version: snapshot.Version, Tag: d.opts.Tag, Dir: d.opts.Dir, ReadOnly: d.opts.ReadOnly,
		Session: d.srv.Session()}, nil
}

// Restore checks that a saved state is this share (same tag and mode: the
// guest driver has the tag cached) and loads its FUSE session against this
// device's directory (Server.Restore), or starts it with none when the
// snapshot's share was not mounted. The directory may differ (a restore on
// another host shares that host's directory); an in-place rollback re-opens
// the session against the same one. On error the device is as before.
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-fs state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-fs: %w", err)
	}
	if s.Tag != d.opts.Tag || s.ReadOnly != d.opts.ReadOnly {
		return fmt.Errorf("restore virtio-fs: snapshot has tag %q read-only=%v, device has tag %q read-only=%v: %w",
			s.Tag, s.ReadOnly, d.opts.Tag, d.opts.ReadOnly, snapshot.ErrMismatch)
	}
	if err := d.srv.Restore(s.Session); err != nil {
		return fmt.Errorf("restore virtio-fs %s: %w", d.opts.Tag, err)
	}
	d.mu.Lock()
	d.restored = true // the transport's restore resets and re-activates the device next (Reset)
	d.mu.Unlock()
	return nil
}

// Kind is virtio-fs's kind in a snapshot's device records.
const Kind = "fs"

// StateKind is virtio-fs's kind in a snapshot's device records.
func (d *Device) StateKind() string { return Kind }

// SaveState returns the state (snapshot.Device).
func (d *Device) SaveState() ([]byte, error) {
	s, err := d.State()
	if err != nil {
		return nil, err
	}
	return snapshot.Save(s)
}

// RestoreState loads a state SaveState returned (snapshot.Device).
func (d *Device) RestoreState(b []byte) error {
	var s State
	if err := snapshot.Load(b, &s); err != nil {
		return fmt.Errorf("restore virtio-fs: %w", err)
	}
	return d.Restore(s)
}
