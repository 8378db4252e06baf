package blk

import (
	"errors"
	"fmt"
)

// Path is the backing file's path (the current one after SetBacking).
func (d *Device) Path() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opts.Path
}

// OpenedPath is the backing file the device was opened with.
func (d *Device) OpenedPath() string { return d.openedPath }

// ReadOnly reports whether the guest sees the disk read-only.
func (d *Device) ReadOnly() bool { return d.opts.ReadOnly }

// Serial is the GET_ID answer.
func (d *Device) Serial() string { return d.opts.Serial }

// ReplaceBacking reopens the disk at its path (after a rollback renamed a
// snapshot's disk copy there) and swaps it in for the old file. The new
// file must have the same capacity: the guest's driver has it cached.
// Call with the transport paused.
func (d *Device) ReplaceBacking() error {
	path := d.Path()
	// The medium keeps its mode: a read-only one (SetBackingMode) is
	// reopened read-only too (a read-only block device refuses O_RDWR).
	d.mu.Lock()
	readOnly := d.opts.ReadOnly || d.mediaRO
	d.mu.Unlock()
	f, sectors, err := openBacking(path, readOnly)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	if cur := d.sectors.Load(); sectors != cur {
		f.Close()
		return fmt.Errorf("virtio-blk %s: new backing file has %d sectors, disk has %d", path, sectors, cur)
	}
	d.mu.Lock()
	old := d.file
	d.file = f
	d.mu.Unlock()
	return old.Close()
}

// SetBacking re-points the disk at another file: a media change, as when a
// drive slot gets a container's rootfs image. The file is opened with the
// disk's mode (read-only disks read-only); its size becomes the capacity,
// and an active device raises the config-change interrupt so the guest's
// driver re-reads it (Linux virtio_blk revalidates the capacity). A request
// in progress finishes on the old file first (the device lock); the caller
// should also pause the transport so no kick is processed mid-swap. On
// error the disk keeps its old file. Returns the new capacity in sectors.
func (d *Device) SetBacking(path string) (uint64, error) {
	return d.SetBackingMode(path, false)
}

// SetBackingMode is SetBacking with a media mode: readOnly opens the file
// (or block device) read-only and fails every write request with IOERR
// until the next SetBacking (VIRTIO_BLK_F_RO is negotiated once at boot,
// so a slot cannot change it per medium).
func (d *Device) SetBackingMode(path string, readOnly bool) (uint64, error) {
	if path == "" {
		return 0, errors.New("virtio-blk: set backing: empty path")
	}
	f, sectors, err := openBacking(path, d.opts.ReadOnly || readOnly)
	if err != nil {
		return 0, err // names the file; the caller names the disk
	}
	d.mu.Lock()
	old := d.file
	d.file = f
	d.opts.Path = path
	d.mediaRO = readOnly
	d.sectors.Store(sectors)
	if d.env != nil {
		d.env.ConfigChanged()
	}
	d.mu.Unlock()
	// Writes went to the old file with WriteAt, so they are in the host's
	// page cache whatever close reports; the guest flushed what it needed.
	_ = old.Close()
	return sectors, nil
}
