package fs

import (
	"errors"
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// ErrMounted refuses a snapshot while the guest has the share mounted.
//
// A snapshot does not roll the shared directory back (it is the host's
// directory, not a disk image), and the guest's FUSE state (node ids it
// looked up, open file handles) lives in guest memory that a restore
// brings back while this server's inode table would be empty: every node
// id would be stale. So a VM with a live FUSE session is not snapshotted;
// unmount the share first (umount sends FUSE_DESTROY), snapshot, mount
// again. A snapshot taken while unmounted restores with the share re-opened
// at its configured path and an empty inode table.
var ErrMounted = errors.New("virtio-fs share is mounted in the guest: unmount it before a snapshot (a snapshot cannot carry the guest's FUSE session)")

// State is the device's serializable state: the share's identity only.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	Version  uint32 `json:"Version"`
	Tag      string `json:"Tag"`
	Dir      string `json:"Dir"`
	ReadOnly bool   `json:"ReadOnly"`
}

// State returns the device state, or ErrMounted.
func (d *Device) State() (State, error) {
	if d.srv.Mounted() {
		return State{}, fmt.Errorf("virtio-fs %s: %w", d.opts.Tag, ErrMounted)
	}
	return State{Version: snapshot.Version, Tag: d.opts.Tag, Dir: d.opts.Dir, ReadOnly: d.opts.ReadOnly}, nil
}

// Restore checks that a saved state is this share (same tag and mode: the
// guest driver has the tag cached) and starts it with no FUSE session.
// The directory may differ (a restore on another host shares that host's
// directory).
func (d *Device) Restore(s State) error {
	if err := snapshot.CheckVersion("virtio-fs state", s.Version); err != nil {
		return fmt.Errorf("restore virtio-fs: %w", err)
	}
	if s.Tag != d.opts.Tag || s.ReadOnly != d.opts.ReadOnly {
		return fmt.Errorf("restore virtio-fs: snapshot has tag %q read-only=%v, device has tag %q read-only=%v",
			s.Tag, s.ReadOnly, d.opts.Tag, d.opts.ReadOnly)
	}
	d.srv.Reset()
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
