package snapshot

import (
	"fmt"
	"strconv"
)

// Version is the snapshot format version, the one number that says how a
// snapshot directory is encoded: the manifest and its file names, the state
// file's framing, the state payload (vCPU and VM state here, each device's
// state in the device's own state.go), the memory layers and bitmaps, the
// disk copies, and cube-vmm's configuration recorded in the manifest. Every
// version field in a snapshot holds it: the manifest's format_version, the
// state file header, and the payload's and each device state's Version.
//
// Bump it, in this one place, when a snapshot written by this code would be
// misread by the code before the change, or one written before would be
// misread by the code after it: a field renamed, removed, retyped or given
// another meaning; a field added that a restore cannot do without; a file
// renamed or laid out differently; devices added to or removed from what a
// given configuration attaches, or reordered. A field added with omitempty
// whose zero value means "as before" is not a bump. Then add
// testdata/v<Version> (the golden snapshot; see golden_test.go) and say in
// docs/snapshot.md ("Format versions") what changed.
//
// A build reads exactly the version it writes; Open, DecodeState, the payload
// decoder and every device's state refuse any other with ErrVersion.
const Version = 1

// CheckVersion refuses a version field other than Version; what names the
// field for the message ("state file", "virtio-blk state").
func CheckVersion(what string, v uint32) error {
	if v != Version {
		return fmt.Errorf("%s version %d, this build reads %d: %w", what, v, Version, ErrVersion)
	}
	return nil
}

// VMMVersion is what cube-vmm records as the manifest's components.vmm_version
// ("cube-vmm/1 state/1" for version 1) and requires on restore and rollback.
// It follows Version: it is not a version of its own.
func VMMVersion() string {
	v := strconv.Itoa(Version)
	return "cube-vmm/" + v + " state/" + v
}
