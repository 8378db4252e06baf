// Package store is Cube's snapshot store: named, immutable VM snapshots on
// disk with their lineage and the references of the VMs that map them. The
// cube CLI and the HTTP facade use it (the shim's VMM writes into the
// directories they reserve; the shim does not open the store); several
// processes may share one root. docs/store.md is the user-facing description.
//
// On-disk layout under the root (store format version 1, FormatVersion):
//
//	store-version              "1": the layout and every metadata file's version
//	lock                       flock: exclusive for mutations, shared for reads
//	snapshots/<id>/            one VM snapshot directory per snapshot, in the format of
//	                           hypervisor/snapshot (manifest.json, state.bin, memory.bin, …)
//	snapshots/<id>/cube-store.json
//	                           this package's metadata; a snapshot exists (is committed)
//	                           exactly when this file does
//	snapshots/.<id>.tmp-*      cube-vmm's own temporary directory while it writes <id>
//	pending/<id>.json          a Begin not yet committed or aborted: owner process, op, names
//	names/<name>               symlink to <id>: names are unique in the store
//	refs/<id>/<h>.json         one reference per holder (h: hash of the holder's name)
//	trash/                     snapshots being deleted
//
// The VM snapshot directories are siblings because an incremental VM snapshot
// names its parent's memory layers as ../<parent>/memory.bin and cube-vmm
// writes it beside its parent; and a VM snapshot is never moved after cube-vmm
// wrote it, because cube-vmm remembers its last snapshot by path (the parent
// of its next incremental snapshot and of a fast rollback). So Begin hands out
// the final path, cube-vmm writes there atomically (its own temporary name and
// rename), and Commit makes the snapshot visible by renaming cube-store.json
// into place.
//
// Everything read from disk is untrusted: metadata files are bounded and
// validated (parse.go) and a file that does not validate is refused with
// ErrCorrupt (errdefs.ErrDataLoss), never trusted in part.
package store
