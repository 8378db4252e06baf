package vmmcmd

import (
	"fmt"
	"os"
	"slices"
)

// A restore's drives without a working copy (-disk-use) and re-pointed
// before the vCPUs run (-disk-set). Both serve a restore whose caller has
// the drives' files already: a template restore, whose drive slots were
// empty stubs when the template was made, needs neither a copy of each stub
// (a copy, and an fsync, per slot where the filesystem cannot reflink) nor
// the disk-set op after the guest runs to give it the first container's
// rootfs (the guest then learns the new capacity while it is still being
// reconnected to, not when the rootfs is mounted).

// checkDiskFlags refuses -disk-use and -disk-set serials the snapshot's
// configuration lacks, -disk-use of a read-only disk, and a serial given
// both a -disk-use and a -disk-path (a working copy and none).
func checkDiskFlags(cfg Config, readOnly func(i int) bool, f restoreFlags) error {
	index := func(serial string) int {
		return slices.IndexFunc(cfg.Disks, func(d Disk) bool { return d.Serial == serial })
	}
	for serial := range f.diskUses {
		i := index(serial)
		switch {
		case i < 0:
			return usageError{fmt.Errorf("-disk-use: the snapshot has no disk with serial %q", serial)}
		case readOnly(i):
			return usageError{fmt.Errorf("-disk-use: disk %q is read-only (it has no working copy to replace)", serial)}
		}
		if _, both := f.diskPaths[serial]; both {
			return usageError{fmt.Errorf("disk %q has both a -disk-path (a working copy there) and a -disk-use (none)", serial)}
		}
	}
	for serial := range f.diskSets {
		if index(serial) < 0 {
			return usageError{fmt.Errorf("-disk-set: the snapshot has no disk with serial %q", serial)}
		}
	}
	return nil
}

// useDisk points disk d at path, the caller's file used as it is (no
// working copy), which must be as large as the snapshot's disk: the
// device's restored capacity is the snapshot's.
func useDisk(d *Disk, path string, size int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("-disk-use %s: %v", d.Serial, err)
	}
	if fi.Size() != size {
		return fmt.Errorf("-disk-use %s: %s has %d bytes, the snapshot's disk %d", d.Serial, path, fi.Size(), size)
	}
	d.Path = path
	return nil
}

// startRestored starts the restored VM's vCPUs (parked if paused) and
// applies -disk-set. Ordering: the drives are re-pointed while the vCPUs
// are parked, before the guest's first instruction after the restore, so
// the guest sees each media change as it resumes.
func (r *restored) startRestored(paused bool, sets diskPathFlags) error {
	if err := r.m.StartRestored(paused || len(sets) > 0); err != nil {
		return err
	}
	r.steps.Mark("start")
	if len(sets) == 0 {
		return nil
	}
	serials := make([]string, 0, len(sets))
	for s := range sets {
		serials = append(serials, s)
	}
	slices.Sort(serials)
	for _, serial := range serials {
		if _, err := setDiskPath(r.m, r.cfg.Disks, serial, sets[serial], false); err != nil {
			return fmt.Errorf("-disk-set: %w", err)
		}
	}
	if !paused {
		if err := r.m.Resume(); err != nil {
			return err
		}
	}
	r.steps.Mark("disk-set")
	return nil
}
